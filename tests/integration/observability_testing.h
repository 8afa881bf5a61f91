// Shared by the observability tests: a plain HTTP GET over a loopback socket
// (gzip answers unpacked), and promtool, extracted from Debian's prometheus package into a cache
// directory (apt-get download + dpkg-deb; no server install).
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <optional>
#include <string>

#include <fmt/format.h>

#include "core/error.h"
#include "support/run_command.h"
#include "support/temp_dir.h"

namespace dtrain::testing {

// The whole of a gzip stream (a file's bytes or an HTTP body); throws Error
// when it is not one.
inline std::string gunzip(const std::string& bytes) {
  z_stream z{};
  if (inflateInit2(&z, 16 + MAX_WBITS) != Z_OK) throw Error("inflateInit2 failed");
  z.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(bytes.data()));
  z.avail_in = static_cast<uInt>(bytes.size());
  std::string out;
  char buf[65536];
  int rc = Z_OK;
  while (rc == Z_OK) {
    z.next_out = reinterpret_cast<Bytef*>(buf);
    z.avail_out = sizeof buf;
    rc = inflate(&z, Z_NO_FLUSH);
    out.append(buf, sizeof buf - z.avail_out);
  }
  inflateEnd(&z);
  if (rc != Z_STREAM_END) throw Error(fmt::format("not a whole gzip stream (zlib {})", rc));
  return out;
}

// GET http://127.0.0.1:PORT/PATH; the body of a 200 answer (unpacked when
// the answer says Content-Encoding: gzip, which TensorBoard's JSON answers
// do), nullopt otherwise (nothing listening, another status). `timeout`: of
// each read.
inline std::optional<std::string> http_get(int port, const std::string& path, int timeout_s = 5) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return std::nullopt;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<std::uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  timeval tv{timeout_s, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  std::string response;
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0) {
    const std::string request = fmt::format(
        "GET {} HTTP/1.1\r\nHost: 127.0.0.1\r\nAccept-Encoding: gzip\r\nConnection: close\r\n\r\n", path);
    if (::send(fd, request.data(), request.size(), 0) == static_cast<ssize_t>(request.size())) {
      char buf[4096];
      for (ssize_t n; (n = ::recv(fd, buf, sizeof buf, 0)) > 0;) response.append(buf, static_cast<std::size_t>(n));
    }
  }
  ::close(fd);
  const auto head_end = response.find("\r\n\r\n");
  if (response.rfind("HTTP/1.", 0) != 0 || response.find(" 200 ") > 12 || head_end == std::string::npos) {
    return std::nullopt;
  }
  std::string head = response.substr(0, head_end);
  for (char& c : head) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  const std::string body = response.substr(head_end + 4);
  return head.find("content-encoding: gzip") != std::string::npos ? gunzip(body) : body;
}

// promtool's path, or the reason it is not available.
struct Promtool {
  std::string path;
  std::string why_not;
};

inline Promtool find_promtool() {
  const auto cache = std::filesystem::temp_directory_path() / "dtrain-test-promtool";
  const auto tool = cache / "usr" / "bin" / "promtool";
  if (std::filesystem::exists(tool)) return {tool.string(), ""};
  std::filesystem::create_directories(cache);
  // Each test process unpacks into a directory of its own, then renames the
  // tool into place, so concurrent tests never see half a file.
  const CommandResult r = run_command(fmt::format(
      "d=$(mktemp -d -p '{0}') && cd \"$d\" && timeout 300 apt-get download prometheus && "
      "dpkg-deb --fsys-tarfile prometheus_*.deb | tar -x ./usr/bin/promtool && mkdir -p '{0}/usr/bin' && "
      "mv usr/bin/promtool '{0}/usr/bin/promtool'; rc=$?; rm -rf \"$d\"; exit $rc",
      cache.string()));
  if (r.exit_code != 0 || !std::filesystem::exists(tool)) {
    return {"", "promtool is not available: 'apt-get download prometheus' failed: " + r.output};
  }
  return {tool.string(), ""};
}

// promtool check metrics on `page`: its exit code and output.
inline CommandResult promtool_check(const Promtool& promtool, const TempDir& dir, const std::string& page) {
  const auto file = dir.write("page.prom", page);
  return run_command(fmt::format("'{}' check metrics < '{}'", promtool.path, file.string()));
}

}  // namespace dtrain::testing
