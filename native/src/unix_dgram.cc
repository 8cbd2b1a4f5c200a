// sendUnixDatagram(path, data): one datagram to an AF_UNIX SOCK_DGRAM
// socket, for sd_notify(3). Node's dgram module has no unix sockets.
#include "common.h"

#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstddef>
#include <cstring>
#include <string>

namespace lbagent {

namespace {

Napi::Value SendUnixDatagram(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  if (info.Length() < 2 || !info[0].IsString() || !info[1].IsBuffer()) {
    throw Napi::TypeError::New(env, "sendUnixDatagram(path: string, data: Buffer)");
  }
  std::string path = info[0].As<Napi::String>().Utf8Value();
  Napi::Buffer<uint8_t> data = info[1].As<Napi::Buffer<uint8_t>>();
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  socklen_t len;
  // sd_notify(3): NOTIFY_SOCKET may name an abstract socket, written with a
  // leading '@' that stands for the leading NUL byte (unix(7)); its address
  // length covers exactly the name, with no terminating NUL.
  if (path.empty() || path.size() >= sizeof(addr.sun_path)) {
    throw Napi::RangeError::New(env, "unix socket path must be 1..107 bytes");
  }
  if (path[0] == '@') {
    addr.sun_path[0] = '\0';
    std::memcpy(addr.sun_path + 1, path.data() + 1, path.size() - 1);
    len = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + path.size());
  } else {
    std::memcpy(addr.sun_path, path.data(), path.size());
    len = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + path.size() + 1);
  }
  int fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (fd < 0) throw ErrnoError(env, errno, "socket");
  ssize_t n;
  do {
    // MSG_DONTWAIT: never block the event loop on a full receiver queue;
    // the caller sees EAGAIN instead.
    n = sendto(fd, data.Data(), data.Length(), MSG_DONTWAIT | MSG_NOSIGNAL, reinterpret_cast<sockaddr*>(&addr), len);
  } while (n < 0 && errno == EINTR);
  int err = errno;
  close(fd);
  if (n < 0) throw ErrnoError(env, err, "sendto", path.c_str());
  return Napi::Number::New(env, static_cast<double>(n));
}

}  // namespace

Napi::Object InitUnixDgram(Napi::Env env, Napi::Object exports) {
  exports.Set("sendUnixDatagram", Napi::Function::New(env, SendUnixDatagram, "sendUnixDatagram"));
  return exports;
}

}  // namespace lbagent
