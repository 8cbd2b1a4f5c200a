// sendUnixDatagram(path, data[, fds]): one datagram to an AF_UNIX SOCK_DGRAM
// socket, for sd_notify(3), optionally carrying file descriptors as
// SCM_RIGHTS (systemd's fd store: FDSTORE=1). Node's dgram module has no
// unix sockets and no descriptor passing.
#include "common.h"

#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstddef>
#include <cstring>
#include <string>
#include <vector>

namespace lbagent {

namespace {

Napi::Value SendUnixDatagram(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  if (info.Length() < 2 || !info[0].IsString() || !info[1].IsBuffer() || (info.Length() > 2 && !info[2].IsArray() && !info[2].IsUndefined())) {
    throw Napi::TypeError::New(env, "sendUnixDatagram(path: string, data: Buffer, fds?: number[])");
  }
  std::vector<int> fds;
  if (info.Length() > 2 && info[2].IsArray()) {
    Napi::Array arr = info[2].As<Napi::Array>();
    // SCM_MAX_FD is 253 (net/scm.h); sd_notify callers pass a handful.
    if (arr.Length() > 253) throw Napi::RangeError::New(env, "at most 253 file descriptors per message");
    for (uint32_t i = 0; i < arr.Length(); i++) {
      Napi::Value v = arr.Get(i);
      if (!v.IsNumber()) throw Napi::TypeError::New(env, "fds must be numbers");
      int32_t d = v.As<Napi::Number>().Int32Value();
      if (d < 0) throw Napi::RangeError::New(env, "fds must be >= 0");
      fds.push_back(d);
    }
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
    iovec iov{};
    iov.iov_base = data.Data();
    iov.iov_len = data.Length();
    msghdr msg{};
    msg.msg_name = &addr;
    msg.msg_namelen = len;
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    std::vector<char> control;
    if (!fds.empty()) {
      control.assign(CMSG_SPACE(sizeof(int) * fds.size()), 0);
      msg.msg_control = control.data();
      msg.msg_controllen = control.size();
      cmsghdr* c = CMSG_FIRSTHDR(&msg);
      c->cmsg_level = SOL_SOCKET;
      c->cmsg_type = SCM_RIGHTS;
      c->cmsg_len = CMSG_LEN(sizeof(int) * fds.size());
      std::memcpy(CMSG_DATA(c), fds.data(), sizeof(int) * fds.size());
    }
    n = sendmsg(fd, &msg, MSG_DONTWAIT | MSG_NOSIGNAL);
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
