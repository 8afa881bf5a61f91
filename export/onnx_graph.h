// GraphBuilder: appends nodes, constants and initializers to one
// onnx::GraphProto under names the caller chooses (dtrain's parameter names
// for weights, dotted paths such as "layer.0.attn.scores" for values), so an
// exported graph reads like the model that trained it.
//
// Contract: every name given to node() or to an initializer is new in the
// graph (a repeated name is a bug of the exporter: DTRAIN_CHECK); inputs name
// values added before. The builder does not own the graph and must not
// outlive it. One thread.
#pragma once

#include <cstdint>
#include <set>
#include <string>
#include <variant>
#include <vector>

#include <onnx/onnx_pb.h>

namespace dtrain::exporter {

// One node attribute: an int, a float or a list of ints.
struct Attr {
  std::string name;
  std::variant<std::int64_t, float, std::vector<std::int64_t>> value;
};

class GraphBuilder {
 public:
  explicit GraphBuilder(onnx::GraphProto* graph) : graph_(graph) {}

  // Adds node `op` reading `inputs` ("" skips an optional input) and writing
  // the value `output`, which also names the node; returns `output`.
  std::string node(const std::string& op, const std::vector<std::string>& inputs, const std::string& output,
                   const std::vector<Attr>& attrs = {});
  // The same with several outputs, named in order.
  void node(const std::string& op, const std::vector<std::string>& inputs, const std::vector<std::string>& outputs,
            const std::vector<Attr>& attrs = {});

  // A new initializer `name` of `type` and `dims`, its data still empty: the
  // caller fills raw_data (little-endian, row-major).
  onnx::TensorProto* initializer(const std::string& name, onnx::TensorProto::DataType type,
                                 const std::vector<std::int64_t>& dims);
  // Small constants (shapes, axes, scalars) as initializers; returns the name.
  // Empty dims: a scalar.
  std::string constant_i64(const std::string& name, const std::vector<std::int64_t>& values,
                           const std::vector<std::int64_t>& dims);
  std::string constant_f32(const std::string& name, float value);
  // A float tensor constant of `dims` (values row-major); returns the name.
  std::string constant_f32_tensor(const std::string& name, const std::vector<float>& values,
                                  const std::vector<std::int64_t>& dims);

  // A graph input or output of `type`; a dim is a size (>= 0) or, through
  // `names`, a symbolic dimension ("batch", "seq") where names[i] is not empty.
  void input(const std::string& name, onnx::TensorProto::DataType type, const std::vector<std::int64_t>& dims,
             const std::vector<std::string>& names);
  void output(const std::string& name, onnx::TensorProto::DataType type, const std::vector<std::int64_t>& dims,
              const std::vector<std::string>& names);

 private:
  void claim(const std::string& name);

  onnx::GraphProto* graph_;
  std::set<std::string> names_;
};

}  // namespace dtrain::exporter
