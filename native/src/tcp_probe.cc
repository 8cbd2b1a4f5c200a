// TcpProbeHandle: TCP connect probes on raw descriptors, many at once, for the
// health checker. One epoll descriptor holds every probe socket and
// libuv watches that one descriptor (uv_poll, as packet_socket.cc does): no
// thread, no per-socket libuv handle, no JavaScript object per probe.
// Syscalls only: socket, connect, epoll_ctl, epoll_wait, getsockopt(SO_ERROR),
// setsockopt(SO_LINGER, TCP_QUICKACK), shutdown, recv, close. Which targets, when, the timeout, what an errno means
// and when a closing socket has waited long enough are TypeScript's
// (agent/health/native-probe.ts). Results go back as errno numbers, in batches,
// through two typed arrays the caller lends us at construction.
//
// A probe socket's life:
//   connect(): socket(SOCK_NONBLOCK|SOCK_CLOEXEC) + connect(); registered
//     edge-triggered for EPOLLOUT|EPOLLIN|EPOLLRDHUP so one registration
//     serves both the connect and the close (no EPOLL_CTL_MOD);
//   ready: EPOLLOUT alone is a made connection; with EPOLLERR, SO_ERROR is
//     the errno; reported with the id, and a failed socket is closed at once;
//   connected, close mode kReset: connect(AF_UNSPEC) at once, so the kernel
//     sends a RST (tcp_disconnect, what close() with SO_LINGER {1, 0} runs
//     too): no FIN exchange, no TIME_WAIT, as HAProxy's L4 check does. With
//     kResetBeforeAck (the default the TypeScript side asks for),
//     TCP_QUICKACK is also switched off before each connect(), so the
//     SYN-ACK's ACK is still delayed when the RST goes (HAProxy's exact
//     sequence: SYN, SYN-ACK, RST; the backend never accepts a connection).
//     Whether to reset is TypeScript's choice;
//   reset modes, the socket afterwards: disconnected (TCP_CLOSE, its port
//     released, sk_err cleared by the next connect's tcp_connect_init) and
//     kept, still in the epoll set, for the next probe to the same address
//     (kIdle; a failed or cancelled connect is disconnected and kept the
//     same way). socket(), epoll_ctl(ADD), close() and the allocation and
//     freeing of the socket are saved: a probe on loopback 27 -> 17 us of
//     CPU. Only probes to the same address share a socket: after
//     a disconnect the kernel continues the initial sequence number from the
//     old one (write_seq + max_window + 2, not a fresh secure_tcp_seq()),
//     so whoever saw a socket's SYN could predict its next; a backend only
//     ever sees the SYNs of probes to itself. At most kMaxIdle are kept;
//     beyond that a disconnected socket is closed;
//   trim(): kept sockets not reused since the previous trim are closed;
//     TypeScript calls it on its own timer (how long one may wait is its
//     policy);
//   connected, close mode kFin: the id is free again; we send our FIN
//     (shutdown SHUT_WR) and keep the socket until the backend's FIN, reading
//     and discarding what it sends, then close(). close() with unread data
//     sends a RST (RFC 2525 §2.17), and so does data arriving after close();
//     a socket held until the backend's FIN closes without either, exactly
//     like the Node-socket probe (agent/health/probe.ts politeClose).
//     TIME_WAIT stays on our side.
//   sweep(): sockets still waiting for a FIN since the previous sweep are
//     closed; TypeScript calls it on its own timer, so how long a backend may
//     take to close is its policy, not ours.
#include "common.h"
#include "loop_handles.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>
#include <uv.h>

#include <cerrno>
#include <cstring>
#include <cstddef>
#include <cstdint>
#include <iterator>
#include <memory>
#include <unordered_map>
#include <vector>

namespace lbagent {

namespace {

// Largest probe id: ids index a table, so they must be small and dense (the
// caller hands out the lowest free ones).
constexpr uint32_t kMaxId = 1u << 22;
// Reads per readiness of a closing socket. Edge-triggered, so a backend that
// keeps sending is read again at its next segment; one that flooded us once
// and stopped is closed by sweep() (with a RST: its data was never wanted).
constexpr int kMaxReadsPerWake = 16;
// Rounds of epoll_wait per libuv wake-up, each handed to JavaScript in one
// call. One: each callback frees slots the checker refills at once (new
// connects, which on a near backend are ready before the next round), so
// more rounds chained whole periods of probes into one loop iteration; at
// 10,000 targets with 8 rounds the event loop stalled 1-2.7 s at a time
// (bench/health.ts). libuv calls again on its next iteration while
// the epoll descriptor stays readable, after timers and other handles.
constexpr int kMaxRoundsPerWake = 1;
// Disconnected sockets kept for reuse, in all: each is a TCP socket, a file
// and an epoll item in the kernel (~4 KiB), none of it in our RSS. 1,024 is
// the TypeScript side's default limit of probes in flight.
constexpr int64_t kMaxIdle = 1024;

// How a connected probe socket ends (the constructor's fourth argument).
enum class CloseMode : int { kFin = 0, kReset = 1, kResetBeforeAck = 2 };

enum class FdKind : uint8_t { kNone = 0, kConnecting = 1, kClosing = 2, kIdle = 3 };

struct FdState {
  FdKind kind = FdKind::kNone;
  // kConnecting: the probe id. kClosing: which closing list holds it (0/1).
  uint32_t value = 0;
  // kConnecting and kIdle: the address (host order) it connects or connected to.
  uint32_t addr = 0;
  // An AF_INET6 socket: never kept for reuse (the kept ones are keyed by IPv4 address).
  bool v6 = false;
};

class TcpProbeHandle : public Napi::ObjectWrap<TcpProbeHandle> {
 public:
  static Napi::Function Define(Napi::Env env) {
    return DefineClass(env, "TcpProbeHandle",
                       {
                           InstanceMethod("connect", &TcpProbeHandle::Connect),
                           InstanceMethod("cancel", &TcpProbeHandle::Cancel),
                           InstanceMethod("sweep", &TcpProbeHandle::Sweep),
                           InstanceMethod("trim", &TcpProbeHandle::Trim),
                           InstanceMethod("stats", &TcpProbeHandle::Stats),
                           InstanceMethod("close", &TcpProbeHandle::Close),
                       });
  }

  // new TcpProbeHandle(callback(count), resultIds: Uint32Array, resultErrnos: Int32Array, closeMode = 0)
  // closeMode: 0 FIN and wait for the backend's FIN, 1 RST, 2 RST before the handshake's ACK.
  explicit TcpProbeHandle(const Napi::CallbackInfo& info) : Napi::ObjectWrap<TcpProbeHandle>(info) {
    Napi::Env env = info.Env();
    if (info.Length() < 3 || !info[0].IsFunction() || !info[1].IsTypedArray() || !info[2].IsTypedArray()) {
      throw Napi::TypeError::New(env, "TcpProbeHandle(callback, resultIds: Uint32Array, resultErrnos: Int32Array)");
    }
    Napi::TypedArray ids = info[1].As<Napi::TypedArray>();
    Napi::TypedArray errs = info[2].As<Napi::TypedArray>();
    if (ids.TypedArrayType() != napi_uint32_array || errs.TypedArrayType() != napi_int32_array) {
      throw Napi::TypeError::New(env, "result arrays must be a Uint32Array and an Int32Array");
    }
    if (ids.ElementLength() == 0 || ids.ElementLength() != errs.ElementLength() || ids.ElementLength() > 65536) {
      throw Napi::RangeError::New(env, "result arrays must have the same length, 1..65536");
    }
    if (info.Length() >= 4 && !info[3].IsUndefined()) {
      if (!info[3].IsNumber()) throw Napi::TypeError::New(env, "closeMode must be a number");
      int32_t mode = info[3].As<Napi::Number>().Int32Value();
      if (mode < 0 || mode > 2) throw Napi::RangeError::New(env, "closeMode must be 0 (FIN), 1 (RST) or 2 (RST before the ACK)");
      close_mode_ = static_cast<CloseMode>(mode);
    }
    capacity_ = static_cast<int>(ids.ElementLength());
    callback_ = Napi::Persistent(info[0].As<Napi::Function>());
    result_ids_ = Napi::Persistent(info[1].As<Napi::Uint32Array>());
    result_errnos_ = Napi::Persistent(info[2].As<Napi::Int32Array>());
    events_.resize(static_cast<size_t>(capacity_));
    context_ = std::make_unique<Napi::AsyncContext>(env, "lbagent:TcpProbe");

    epfd_ = epoll_create1(EPOLL_CLOEXEC);
    if (epfd_ < 0) throw ErrnoError(env, errno, "epoll_create1");
    int rc = 0;
    const char* call = nullptr;
    poll_ = StartReadPoll(env, epfd_, this, &TcpProbeHandle::OnReadable, &rc, &call);
    if (poll_ == nullptr) {
      CloseEpoll();
      throw ErrnoError(env, -rc, call);
    }
    // Like a Node socket: the loop stays alive while a probe socket is open,
    // and only then (see Opened/Closed).
    uv_unref(reinterpret_cast<uv_handle_t*>(poll_));
    Ref();  // the poll callback needs the wrapper until close()
    polling_ = true;
    teardown_.Add(env, this);
  }

  ~TcpProbeHandle() override { Release(); }

 private:
  void CheckOpen(Napi::Env env) {
    if (epfd_ < 0) throw ErrnoError(env, EBADF, "tcp probe handle", "closed");
  }

  // connect(ids: Uint32Array, addrs: Uint32Array, ports: Uint16Array, count, out: Int32Array, addrs6?: Uint8Array)
  // addrs are IPv4 addresses as host-order integers; with addrs6, an entry
  // whose addrs[i] is 0 (0.0.0.0, never a backend) is the IPv6 address in
  // addrs6[16 i .. 16 i + 16], network order, connected over AF_INET6. out[i] is 0 when the
  // connection was made at once, EINPROGRESS when its result will come through
  // the callback, or the errno of socket()/connect()/epoll_ctl() (the socket
  // is then closed and the id free). Arguments are checked before any socket
  // is opened, so a bad call opens nothing.
  Napi::Value Connect(const Napi::CallbackInfo& info) {
    Napi::Env env = info.Env();
    CheckOpen(env);
    if (info.Length() < 5 || !info[0].IsTypedArray() || !info[1].IsTypedArray() || !info[2].IsTypedArray() ||
        !info[3].IsNumber() || !info[4].IsTypedArray()) {
      throw Napi::TypeError::New(env, "connect(ids: Uint32Array, addrs: Uint32Array, ports: Uint16Array, count, out: Int32Array)");
    }
    Napi::TypedArray ta_ids = info[0].As<Napi::TypedArray>();
    Napi::TypedArray ta_addrs = info[1].As<Napi::TypedArray>();
    Napi::TypedArray ta_ports = info[2].As<Napi::TypedArray>();
    Napi::TypedArray ta_out = info[4].As<Napi::TypedArray>();
    if (ta_ids.TypedArrayType() != napi_uint32_array || ta_addrs.TypedArrayType() != napi_uint32_array ||
        ta_ports.TypedArrayType() != napi_uint16_array || ta_out.TypedArrayType() != napi_int32_array) {
      throw Napi::TypeError::New(env, "connect: ids Uint32Array, addrs Uint32Array, ports Uint16Array, out Int32Array");
    }
    int64_t count = info[3].As<Napi::Number>().Int64Value();
    if (count < 0 || static_cast<size_t>(count) > ta_ids.ElementLength() || static_cast<size_t>(count) > ta_addrs.ElementLength() ||
        static_cast<size_t>(count) > ta_ports.ElementLength() || static_cast<size_t>(count) > ta_out.ElementLength()) {
      throw Napi::RangeError::New(env, "connect: count beyond an array's length");
    }
    const uint8_t* addrs6 = nullptr;
    if (info.Length() > 5 && !info[5].IsUndefined()) {
      if (!info[5].IsTypedArray() || info[5].As<Napi::TypedArray>().TypedArrayType() != napi_uint8_array) {
        throw Napi::TypeError::New(env, "connect: addrs6 must be a Uint8Array");
      }
      Napi::Uint8Array ta6 = info[5].As<Napi::Uint8Array>();
      if (static_cast<size_t>(count) * 16 > ta6.ElementLength()) throw Napi::RangeError::New(env, "connect: count beyond addrs6's length");
      addrs6 = ta6.Data();
    }
    const uint32_t* ids = ta_ids.As<Napi::Uint32Array>().Data();
    const uint32_t* addrs = ta_addrs.As<Napi::Uint32Array>().Data();
    const uint16_t* ports = ta_ports.As<Napi::Uint16Array>().Data();
    int32_t* out = ta_out.As<Napi::Int32Array>().Data();
    for (int64_t i = 0; i < count; i++) {
      if (ids[i] >= kMaxId) throw Napi::RangeError::New(env, "connect: id out of range");
      if (ids[i] < by_id_.size() && by_id_[ids[i]] >= 0) throw Napi::RangeError::New(env, "connect: id already in use");
      if (ports[i] == 0) throw Napi::RangeError::New(env, "connect: port 0");
    }
    for (int64_t i = 0; i < count; i++) {
      const uint8_t* a6 = addrs6 != nullptr && addrs[i] == 0 ? addrs6 + 16 * i : nullptr;
      out[i] = ConnectOne(ids[i], addrs[i], ports[i], a6);
    }
    return env.Undefined();
  }

  int32_t ConnectOne(uint32_t id, uint32_t addr, uint16_t port, const uint8_t* addr6) {
    // The same id twice in one batch: the second is refused, the first keeps its socket.
    if (id < by_id_.size() && by_id_[id] >= 0) return EEXIST;
    int fd = addr6 != nullptr ? -1 : TakeIdle(addr);
    bool fresh = fd < 0;
    if (fresh) {
      fd = socket(addr6 != nullptr ? AF_INET6 : AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
      if (fd < 0) return errno;  // EMFILE, ENFILE, ENOBUFS: the caller's own exhaustion
    } else {
      reused_++;
    }
    if (close_mode_ == CloseMode::kResetBeforeAck) {
      // Pingpong mode: the ACK of the SYN-ACK waits for data or the delayed-ACK
      // timer (tcp_rcv_synsent_state_process), so our RST comes first.
      int zero = 0;
      if (setsockopt(fd, IPPROTO_TCP, TCP_QUICKACK, &zero, sizeof(zero)) < 0) {
        int err = errno;
        ::close(fd);
        return err;
      }
    }
    int rc;
    if (addr6 != nullptr) {
      sockaddr_in6 sa6{};
      sa6.sin6_family = AF_INET6;
      sa6.sin6_port = htons(port);
      std::memcpy(sa6.sin6_addr.s6_addr, addr6, 16);
      rc = connect(fd, reinterpret_cast<sockaddr*>(&sa6), sizeof(sa6));
    } else {
      sockaddr_in sa{};
      sa.sin_family = AF_INET;
      sa.sin_port = htons(port);
      sa.sin_addr.s_addr = htonl(addr);
      rc = connect(fd, reinterpret_cast<sockaddr*>(&sa), sizeof(sa));
    }
    // A non-blocking connect interrupted by a signal goes on asynchronously,
    // as EINPROGRESS does (connect(2)).
    bool pending = rc < 0 && (errno == EINPROGRESS || errno == EINTR);
    if (rc < 0 && !pending) {
      int err = errno;
      ::close(fd);
      return err;
    }
    if (fresh) {
      epoll_event ev{};
      ev.events = EPOLLOUT | EPOLLIN | EPOLLRDHUP | EPOLLET;
      ev.data.fd = fd;
      if (epoll_ctl(epfd_, EPOLL_CTL_ADD, fd, &ev) < 0) {
        int err = errno;
        ::close(fd);
        return err;
      }
    }
    Opened();
    SetState(fd, FdKind::kConnecting, id, addr);
    state_[fd].v6 = addr6 != nullptr;
    if (!pending) {
      EndConnected(fd, 0);
      return 0;
    }
    if (id >= by_id_.size()) by_id_.resize(id + 1, -1);
    by_id_[id] = fd;
    return EINPROGRESS;
  }

  // cancel(id): closes the socket of a probe whose connect has not finished
  // (the caller's timeout). No result is reported for it. True if there was one.
  Napi::Value Cancel(const Napi::CallbackInfo& info) {
    Napi::Env env = info.Env();
    if (info.Length() < 1 || !info[0].IsNumber()) throw Napi::TypeError::New(env, "cancel(id)");
    int64_t id = info[0].As<Napi::Number>().Int64Value();
    if (id < 0 || static_cast<uint64_t>(id) >= by_id_.size() || by_id_[id] < 0) return Napi::Boolean::New(env, false);
    int fd = by_id_[id];
    by_id_[id] = -1;
    EndUnconnected(fd);
    return Napi::Boolean::New(env, true);
  }

  // sweep(): closes every socket that was already waiting for the backend's
  // FIN at the previous sweep; returns how many are still waiting.
  Napi::Value Sweep(const Napi::CallbackInfo& info) {
    int old = cur_ ^ 1;
    for (int fd : closing_[old]) {
      if (fd >= 0 && static_cast<size_t>(fd) < state_.size() && state_[fd].kind == FdKind::kClosing &&
          state_[fd].value == static_cast<uint32_t>(old)) {
        CloseFd(fd);
        swept_++;
      }
    }
    closing_[old].clear();
    cur_ = old;
    return Napi::Number::New(info.Env(), static_cast<double>(closing_count_));
  }

  // trim(): closes the kept sockets that no probe took since the previous
  // trim; returns how many are still kept.
  Napi::Value Trim(const Napi::CallbackInfo& info) {
    for (auto it = idle_.begin(); it != idle_.end();) {
      std::vector<IdleSocket>& list = it->second;
      // Oldest first: each list is pushed at the back and taken from the back.
      size_t old = 0;
      while (old < list.size() && list[old].gen != trim_gen_) old++;
      for (size_t i = 0; i < old; i++) {
        state_[list[i].fd].kind = FdKind::kNone;
        ::close(list[i].fd);
        idle_count_--;
        trimmed_++;
      }
      list.erase(list.begin(), list.begin() + static_cast<std::ptrdiff_t>(old));
      it = list.empty() ? idle_.erase(it) : std::next(it);
    }
    trim_gen_++;
    return Napi::Number::New(info.Env(), static_cast<double>(idle_count_));
  }

  // stats(): { connecting, closing, swept, idle, reused, trimmed } socket counts, for tests and benches.
  Napi::Value Stats(const Napi::CallbackInfo& info) {
    Napi::Env env = info.Env();
    Napi::Object o = Napi::Object::New(env);
    o.Set("connecting", Napi::Number::New(env, static_cast<double>(open_ - closing_count_)));
    o.Set("closing", Napi::Number::New(env, static_cast<double>(closing_count_)));
    o.Set("swept", Napi::Number::New(env, static_cast<double>(swept_)));
    o.Set("idle", Napi::Number::New(env, static_cast<double>(idle_count_)));
    o.Set("reused", Napi::Number::New(env, reused_));
    o.Set("trimmed", Napi::Number::New(env, trimmed_));
    return o;
  }

  Napi::Value Close(const Napi::CallbackInfo& info) {
    Release();
    callback_.Reset();
    return info.Env().Undefined();
  }

  void SetState(int fd, FdKind kind, uint32_t value, uint32_t addr = 0) {
    if (static_cast<size_t>(fd) >= state_.size()) state_.resize(static_cast<size_t>(fd) + 64);
    state_[fd].kind = kind;
    state_[fd].value = value;
    state_[fd].addr = addr;
  }

  // A kept socket that last connected to addr, or -1. Only in the reset
  // modes (a FIN close leaves the socket in TIME_WAIT's hands).
  int TakeIdle(uint32_t addr) {
    if (idle_count_ == 0) return -1;
    auto it = idle_.find(addr);
    if (it == idle_.end()) return -1;
    int fd = it->second.back().fd;
    it->second.pop_back();
    if (it->second.empty()) idle_.erase(it);
    idle_count_--;
    state_[fd].kind = FdKind::kNone;
    return fd;
  }

  // Disconnects a probe socket (a RST if it was connected; nothing on the
  // wire if its SYN is unanswered) and keeps it for the next probe to its
  // address, or closes it when kMaxIdle are kept or the disconnect fails.
  void Disconnect(int fd) {
    sockaddr sa{};
    sa.sa_family = AF_UNSPEC;
    uint32_t addr = state_[fd].addr;
    if (idle_count_ >= kMaxIdle || state_[fd].v6 || connect(fd, &sa, sizeof(sa)) < 0) {
      linger lg{1, 0};
      setsockopt(fd, SOL_SOCKET, SO_LINGER, &lg, sizeof(lg));
      CloseFd(fd);
      return;
    }
    state_[fd].kind = FdKind::kIdle;
    idle_[addr].push_back(IdleSocket{fd, trim_gen_});
    idle_count_++;
    Closed();
  }

  // A probe whose connect failed or was cancelled.
  void EndUnconnected(int fd) {
    if (close_mode_ == CloseMode::kFin) {
      CloseFd(fd);
    } else {
      Disconnect(fd);
    }
  }

  // A made connection ends: a RST now (kReset*), or our FIN (kFin), the
  // socket then kept until the backend's FIN; evs are the readiness events
  // that came with the connect (their edge is consumed).
  void EndConnected(int fd, uint32_t evs) {
    if (close_mode_ != CloseMode::kFin) {
      // tcp_disconnect: a RST, no FIN_WAIT or TIME_WAIT; the socket is kept.
      Disconnect(fd);
      return;
    }
    BeginClose(fd);
    if (evs & (EPOLLIN | EPOLLRDHUP | EPOLLHUP | EPOLLERR)) DrainClosing(fd);
  }

  // Our FIN now; the socket stays until the backend's FIN or the next-but-one sweep.
  void BeginClose(int fd) {
    shutdown(fd, SHUT_WR);
    SetState(fd, FdKind::kClosing, static_cast<uint32_t>(cur_));
    closing_[cur_].push_back(fd);
    closing_count_++;
  }

  // close() also takes the descriptor out of the epoll set (we never dup it).
  void CloseFd(int fd) {
    if (static_cast<size_t>(fd) < state_.size()) {
      if (state_[fd].kind == FdKind::kClosing) closing_count_--;
      state_[fd].kind = FdKind::kNone;
    }
    ::close(fd);
    Closed();
  }

  void Opened() {
    if (open_++ == 0 && poll_ != nullptr) uv_ref(reinterpret_cast<uv_handle_t*>(poll_));
  }
  void Closed() {
    if (--open_ == 0 && poll_ != nullptr) uv_unref(reinterpret_cast<uv_handle_t*>(poll_));
  }

  // Read and discard what a closing socket has; close it at the backend's FIN
  // or on an error (a RST: nothing is left to be polite about).
  void DrainClosing(int fd) {
    char buf[4096];
    for (int i = 0; i < kMaxReadsPerWake; i++) {
      ssize_t n = recv(fd, buf, sizeof(buf), MSG_DONTWAIT);
      if (n > 0) continue;
      if (n < 0 && errno == EINTR) continue;
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
      CloseFd(fd);  // 0: the backend's FIN; < 0: reset or another error
      return;
    }
  }

  void CloseEpoll() {
    if (epfd_ >= 0) ::close(epfd_);
    epfd_ = -1;
  }

  // Closes every probe socket, the poll handle (before its descriptor, as
  // libuv requires) and the epoll descriptor. `hook`: called from the
  // environment's teardown, which waits until it is removed (loop_handles.h).
  void Release(napi_async_cleanup_hook_handle hook = nullptr) {
    teardown_.Remove();
    for (size_t fd = 0; fd < state_.size(); fd++) {
      if (state_[fd].kind != FdKind::kNone) {
        state_[fd].kind = FdKind::kNone;
        ::close(static_cast<int>(fd));
      }
    }
    state_.clear();
    by_id_.clear();
    idle_.clear();
    idle_count_ = 0;
    closing_[0].clear();
    closing_[1].clear();
    open_ = 0;
    closing_count_ = 0;
    CloseHandles({reinterpret_cast<uv_handle_t*>(poll_)}, hook);
    poll_ = nullptr;
    CloseEpoll();
    if (polling_) {
      polling_ = false;
      Unref();
    }
  }

  static void OnReadable(uv_poll_t* handle, int status, int events) {
    try {
      static_cast<TcpProbeHandle*>(handle->data)->Drain();
    } catch (...) {
      // Nothing may unwind into libuv; JavaScript exceptions are handled in Drain.
    }
  }

  void Drain() {
    for (int round = 0; round < kMaxRoundsPerWake && epfd_ >= 0; round++) {
      int n;
      do {
        n = epoll_wait(epfd_, events_.data(), capacity_, 0);
      } while (n < 0 && errno == EINTR);
      if (n <= 0) return;
      Napi::Env env = Env();
      Napi::HandleScope scope(env);
      uint32_t* ids = result_ids_.Value().Data();
      int32_t* errs = result_errnos_.Value().Data();
      int count = 0;
      for (int i = 0; i < n; i++) {
        int fd = events_[i].data.fd;
        if (static_cast<size_t>(fd) >= state_.size()) continue;
        FdState st = state_[fd];
        if (st.kind == FdKind::kClosing) {
          DrainClosing(fd);
          continue;
        }
        if (st.kind != FdKind::kConnecting) continue;
        uint32_t evs = events_[i].events;
        int soerr = 0;
        // A failed connect is EPOLLERR (tcp_poll: sk_err set), its errno in
        // SO_ERROR; without EPOLLERR/EPOLLHUP, EPOLLOUT is a made connection
        // and the getsockopt() is saved. Anything else is not the end of
        // the connect yet.
        if (evs & (EPOLLERR | EPOLLHUP)) {
          socklen_t len = sizeof(soerr);
          if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &soerr, &len) < 0) soerr = errno;
          // HUP without an error: the connection was made and already closed
          // by the backend (a FIN and a reset, say); it was made.
        } else if (!(evs & EPOLLOUT)) {
          continue;
        }
        uint32_t id = st.value;
        by_id_[id] = -1;
        ids[count] = id;
        errs[count] = soerr;
        count++;
        if (soerr != 0) {
          EndUnconnected(fd);
        } else {
          // With a FIN close, data or the backend's FIN that came with the
          // connect is read now: the edge for it has been consumed.
          EndConnected(fd, evs);
        }
      }
      if (count > 0 && !callback_.IsEmpty()) {
        try {
          // MakeCallback: an async context, and the nextTick and microtask
          // queues run afterwards, as after any libuv callback.
          callback_.MakeCallback(env.Global(), {Napi::Number::New(env, count)}, *context_);
        } catch (const Napi::Error& e) {
          napi_fatal_exception(env, e.Value());
        }
      }
      if (n < capacity_) return;
    }
  }

  int epfd_ = -1;
  uv_poll_t* poll_ = nullptr;
  bool polling_ = false;
  EnvTeardown teardown_;
  friend class ::lbagent::EnvTeardown;  // runs Release(hook) at the environment's teardown
  int capacity_ = 0;
  CloseMode close_mode_ = CloseMode::kFin;
  Napi::FunctionReference callback_;
  Napi::Reference<Napi::Uint32Array> result_ids_;
  Napi::Reference<Napi::Int32Array> result_errnos_;
  std::unique_ptr<Napi::AsyncContext> context_;
  std::vector<epoll_event> events_;
  // By descriptor: what the socket is doing. By probe id: its descriptor or -1.
  std::vector<FdState> state_;
  std::vector<int> by_id_;
  // Sockets waiting for the backend's FIN, by sweep generation.
  std::vector<int> closing_[2];
  int cur_ = 0;
  int64_t open_ = 0;
  int64_t closing_count_ = 0;
  double swept_ = 0;
  // Disconnected sockets by the address they last connected to (reset
  // modes), each with the trim generation it was kept in.
  struct IdleSocket {
    int fd;
    uint32_t gen;
  };
  std::unordered_map<uint32_t, std::vector<IdleSocket>> idle_;
  int64_t idle_count_ = 0;
  uint32_t trim_gen_ = 0;
  double reused_ = 0;
  double trimmed_ = 0;
};

}  // namespace

Napi::Object InitTcpProbe(Napi::Env env, Napi::Object exports) {
  exports.Set("TcpProbeHandle", TcpProbeHandle::Define(env));
  return exports;
}

}  // namespace lbagent
