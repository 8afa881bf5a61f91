#include "export/onnx_graph.h"

#include <bit>

#include "core/error.h"

namespace dtrain::exporter {

// Initializers are written as raw little-endian bytes.
static_assert(std::endian::native == std::endian::little, "the ONNX export assumes a little-endian host");

namespace {

void set_attr(onnx::AttributeProto* a, const Attr& attr) {
  a->set_name(attr.name);
  if (const auto* i = std::get_if<std::int64_t>(&attr.value)) {
    a->set_type(onnx::AttributeProto::INT);
    a->set_i(*i);
  } else if (const auto* f = std::get_if<float>(&attr.value)) {
    a->set_type(onnx::AttributeProto::FLOAT);
    a->set_f(*f);
  } else {
    a->set_type(onnx::AttributeProto::INTS);
    for (std::int64_t v : std::get<std::vector<std::int64_t>>(attr.value)) a->add_ints(v);
  }
}

void set_type(onnx::ValueInfoProto* info, const std::string& name, onnx::TensorProto::DataType type,
              const std::vector<std::int64_t>& dims, const std::vector<std::string>& names) {
  DTRAIN_CHECK(names.empty() || names.size() == dims.size(), "{}: {} dims but {} dim names", name, dims.size(),
               names.size());
  info->set_name(name);
  onnx::TypeProto_Tensor* tensor = info->mutable_type()->mutable_tensor_type();
  tensor->set_elem_type(type);
  onnx::TensorShapeProto* shape = tensor->mutable_shape();
  for (std::size_t i = 0; i < dims.size(); ++i) {
    onnx::TensorShapeProto_Dimension* dim = shape->add_dim();
    if (!names.empty() && !names[i].empty()) {
      dim->set_dim_param(names[i]);
    } else {
      dim->set_dim_value(dims[i]);
    }
  }
}

}  // namespace

void GraphBuilder::claim(const std::string& name) {
  DTRAIN_CHECK(!name.empty() && names_.insert(name).second, "ONNX value name '{}' is empty or used twice", name);
}

std::string GraphBuilder::node(const std::string& op, const std::vector<std::string>& inputs,
                               const std::string& output, const std::vector<Attr>& attrs) {
  node(op, inputs, std::vector<std::string>{output}, attrs);
  return output;
}

void GraphBuilder::node(const std::string& op, const std::vector<std::string>& inputs,
                        const std::vector<std::string>& outputs, const std::vector<Attr>& attrs) {
  onnx::NodeProto* n = graph_->add_node();
  n->set_op_type(op);
  n->set_name(outputs.front());
  for (const std::string& in : inputs) n->add_input(in);
  for (const std::string& out : outputs) {
    claim(out);
    n->add_output(out);
  }
  for (const Attr& attr : attrs) set_attr(n->add_attribute(), attr);
}

onnx::TensorProto* GraphBuilder::initializer(const std::string& name, onnx::TensorProto::DataType type,
                                             const std::vector<std::int64_t>& dims) {
  claim(name);
  onnx::TensorProto* t = graph_->add_initializer();
  t->set_name(name);
  t->set_data_type(type);
  for (std::int64_t d : dims) t->add_dims(d);
  return t;
}

std::string GraphBuilder::constant_i64(const std::string& name, const std::vector<std::int64_t>& values,
                                       const std::vector<std::int64_t>& dims) {
  onnx::TensorProto* t = initializer(name, onnx::TensorProto::INT64, dims);
  t->mutable_raw_data()->assign(reinterpret_cast<const char*>(values.data()), values.size() * sizeof(std::int64_t));
  return name;
}

std::string GraphBuilder::constant_f32(const std::string& name, float value) {
  onnx::TensorProto* t = initializer(name, onnx::TensorProto::FLOAT, {});
  t->mutable_raw_data()->assign(reinterpret_cast<const char*>(&value), sizeof value);
  return name;
}

std::string GraphBuilder::constant_f32_tensor(const std::string& name, const std::vector<float>& values,
                                              const std::vector<std::int64_t>& dims) {
  std::int64_t numel = 1;
  for (std::int64_t d : dims) numel *= d;
  DTRAIN_CHECK(numel == static_cast<std::int64_t>(values.size()), "{}: {} values for {} elements", name,
               values.size(), numel);
  onnx::TensorProto* t = initializer(name, onnx::TensorProto::FLOAT, dims);
  t->mutable_raw_data()->assign(reinterpret_cast<const char*>(values.data()), values.size() * sizeof(float));
  return name;
}

void GraphBuilder::input(const std::string& name, onnx::TensorProto::DataType type,
                         const std::vector<std::int64_t>& dims, const std::vector<std::string>& names) {
  claim(name);
  set_type(graph_->add_input(), name, type, dims, names);
}

void GraphBuilder::output(const std::string& name, onnx::TensorProto::DataType type,
                          const std::vector<std::int64_t>& dims, const std::vector<std::string>& names) {
  set_type(graph_->add_output(), name, type, dims, names);  // the node producing it claimed the name
}

}  // namespace dtrain::exporter
