// sendUnixDatagram(path, data[, fds]): one datagram to an AF_UNIX SOCK_DGRAM
// socket, for sd_notify(3), optionally carrying file descriptors as
// SCM_RIGHTS (systemd's fd store: FDSTORE=1). bindUnixDatagram(path) and
// recvUnixDatagram(fd): the receiving end, for a listener hand-over between
// two agent processes outside systemd (HAProxy's -x). Node's dgram module has
// no unix sockets and no descriptor passing.
#include "common.h"

#include <fcntl.h>
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

// bindUnixDatagram(path): a non-blocking AF_UNIX SOCK_DGRAM socket bound to a
// filesystem path (the caller removes a stale file first and unlinks it when
// done); returns the descriptor, closed by the caller (fs.closeSync).
Napi::Value BindUnixDatagram(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  if (info.Length() < 1 || !info[0].IsString()) throw Napi::TypeError::New(env, "bindUnixDatagram(path: string)");
  std::string path = info[0].As<Napi::String>().Utf8Value();
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (path.empty() || path[0] == '@' || path.size() >= sizeof(addr.sun_path)) {
    throw Napi::RangeError::New(env, "unix socket path must be a filesystem path of 1..107 bytes");
  }
  std::memcpy(addr.sun_path, path.data(), path.size());
  int fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) throw ErrnoError(env, errno, "socket");
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + path.size() + 1)) < 0) {
    int err = errno;
    close(fd);
    throw ErrnoError(env, err, "bind", path.c_str());
  }
  return Napi::Number::New(env, fd);
}

// recvUnixDatagram(fd, maxBytes): one datagram and the descriptors it carried
// (SCM_RIGHTS, received close-on-exec), or null when none is queued. A
// datagram whose data or descriptors did not fit is refused (its received
// descriptors closed): a truncated hand-over must not look complete.
Napi::Value RecvUnixDatagram(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  if (info.Length() < 2 || !info[0].IsNumber() || !info[1].IsNumber()) {
    throw Napi::TypeError::New(env, "recvUnixDatagram(fd: number, maxBytes: number)");
  }
  int fd = info[0].As<Napi::Number>().Int32Value();
  int64_t max = info[1].As<Napi::Number>().Int64Value();
  if (fd < 0) throw Napi::RangeError::New(env, "fd must be >= 0");
  if (max < 1 || max > (1 << 20)) throw Napi::RangeError::New(env, "maxBytes must be 1..1048576");
  std::vector<uint8_t> data(static_cast<size_t>(max));
  std::vector<char> control(CMSG_SPACE(sizeof(int) * 253), 0);
  iovec iov{};
  iov.iov_base = data.data();
  iov.iov_len = data.size();
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = control.data();
  msg.msg_controllen = control.size();
  ssize_t n;
  do {
    n = recvmsg(fd, &msg, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
  } while (n < 0 && errno == EINTR);
  if (n < 0) {
    if (errno == EAGAIN || errno == EWOULDBLOCK) return env.Null();
    throw ErrnoError(env, errno, "recvmsg");
  }
  std::vector<int> fds;
  for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c != nullptr; c = CMSG_NXTHDR(&msg, c)) {
    if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
    size_t count = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
    const int* p = reinterpret_cast<const int*>(CMSG_DATA(c));
    for (size_t i = 0; i < count; i++) {
      int d;
      std::memcpy(&d, p + i, sizeof(int));
      fds.push_back(d);
    }
  }
  if (msg.msg_flags & (MSG_TRUNC | MSG_CTRUNC)) {
    for (int d : fds) close(d);
    throw ErrnoError(env, EMSGSIZE, "recvmsg", "datagram or its descriptors truncated");
  }
  Napi::Object out = Napi::Object::New(env);
  out.Set("data", Napi::Buffer<uint8_t>::Copy(env, data.data(), static_cast<size_t>(n)));
  Napi::Array arr = Napi::Array::New(env, fds.size());
  for (size_t i = 0; i < fds.size(); i++) arr.Set(static_cast<uint32_t>(i), Napi::Number::New(env, fds[i]));
  out.Set("fds", arr);
  return out;
}

}  // namespace

Napi::Object InitUnixDgram(Napi::Env env, Napi::Object exports) {
  exports.Set("sendUnixDatagram", Napi::Function::New(env, SendUnixDatagram, "sendUnixDatagram"));
  exports.Set("bindUnixDatagram", Napi::Function::New(env, BindUnixDatagram, "bindUnixDatagram"));
  exports.Set("recvUnixDatagram", Napi::Function::New(env, RecvUnixDatagram, "recvUnixDatagram"));
  return exports;
}

}  // namespace lbagent
