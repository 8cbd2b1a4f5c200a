// RelayHandle: the proxy's byte relay on raw descriptors. One per
// proxy engine (one per worker thread). One epoll descriptor holds the
// listeners and both sockets of every relayed connection; libuv watches that
// one descriptor (uv_poll, as tcp_probe.cc does), so no libuv handle, no
// JavaScript object and no JavaScript call per read or write. A wake-up
// reads that epoll again while it finds something (Drain, kDrainPasses):
// fewer trips through libuv and fewer sleeps of the thread.
//
// Syscalls only: accept4, socket, setsockopt, connect, getsockopt(SO_ERROR), getpeername,
// recv, send, shutdown, close, epoll_*. Every decision stays in TypeScript
// (agent/forward/relay-native.ts and the engine): which connection goes to
// which backend, refusals, retries, PROXY header bytes, idle and connect
// timeouts. JavaScript is entered once per libuv wake-up with everything that
// needs a decision, as records in a Float64Array lent at construction:
//   [kind, id, a, b, c]
//   kAccept    id, listener, IPv4: client address (host order) * 65536 + port;
//              IPv6: the client's port, and c = 6 (its address through peer6())
//   kAcceptErr 0, listener, errno
//   kConnect   id, errno (0: connected)
//   kEnd       id, errno (0: both sides ended cleanly), bytes to backend, to client (since the last report)
//   kHeader    id, 1 the PROXY header went with the client's first bytes, 0 alone
//   kGone      id (a refused client's socket closed: its FIN came or it reset)
// activity() hands over the ids with traffic since its previous call and their
// byte counts (the engine's idle sweep and byte tallies), in a second array.
//
// A connection's sockets are registered once, edge-triggered, for
// EPOLLIN|EPOLLOUT|EPOLLRDHUP: no EPOLL_CTL_MOD, and close(2) takes them out
// of the set (we never dup them), so 2 epoll_ctl per connection. Each
// direction has one 16 KiB buffer: what was read is written to the other side
// at once; a short write keeps the rest and the reading side waits until
// EPOLLOUT lets it drain (backpressure). A read shorter than asked is taken as
// "drained" unless EPOLLRDHUP came (the peer's FIN may sit behind the data),
// saving the read that would return EAGAIN, as HAProxy does.
// Half-close: EOF from one side, once all of it is written on, becomes
// shutdown(SHUT_WR) on the other side one loop turn later (a client that
// closes as soon as it has its answer is then usually read to its end first
// and both sockets just close, with no TIME_WAIT on our side); both done
// closes both. An error on either
// side resets both (SO_LINGER 0).
#include "common.h"
#include "loop_handles.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>
#include <uv.h>

#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <algorithm>
#include <cstring>
#include <memory>
#include <vector>

namespace lbagent {

namespace {

constexpr uint32_t kBufSize = 16 * 1024;
constexpr size_t kFreeBufsMax = 256;
constexpr int kMaxEvents = 256;
constexpr int kAcceptsPerWake = 64;
// Reads of the relay's epoll in one libuv wake-up while they find something (Drain).
constexpr int kDrainPasses = 4;
// Accepted clients handed to JavaScript at a time within one wake-up: each
// holds a descriptor until TypeScript decides (a refusal over maxConnections
// closes it at once), so a burst of 1,000 clients under a 256-descriptor limit
// must not hold 64 per thread undecided (test/privileged/forward-exhaustion).
constexpr int kAcceptsPerFlush = 8;
constexpr int kRecordSize = 5;
constexpr uint32_t kMaxConns = 1u << 22;
constexpr uint32_t kListenerBit = 1u << 31;

enum Kind : int { kAccept = 1, kAcceptErr = 2, kConnect = 3, kEnd = 4, kHeader = 5, kGone = 6 };
enum State : uint8_t { kFree = 0, kWaiting, kConnecting, kConnected, kRelaying, kRefusing };

struct Dir {
  char* buf = nullptr;
  uint32_t start = 0;
  uint32_t end = 0;
  bool eof = false;   // the source sent its FIN (read returned 0)
  bool shut = false;  // our FIN to the destination is queued or sent
  double bytes = 0;
  double reported = 0;
};

struct Conn {
  uint32_t gen = 0;
  State state = kFree;
  int cfd = -1;
  int ufd = -1;
  // Edge-triggered readiness, remembered: [0] client, [1] backend.
  bool in[2] = {false, false};
  bool out[2] = {false, false};
  bool hup[2] = {false, false};
  bool dirty = false;
  // The PROXY header's length at the start of d[0].buf, waiting for the client's first bytes.
  uint32_t hdr = 0;
  Dir d[2];  // [0] client -> backend, [1] backend -> client
};

struct Turn {
  uint32_t id;
  uint32_t gen;
  uint8_t what;  // 0: the header goes alone; 1: FIN client -> backend side; 2: FIN to the client
};

struct Listener {
  int fd = -1;
};

class RelayHandle : public Napi::ObjectWrap<RelayHandle> {
 public:
  static Napi::Function Define(Napi::Env env) {
    return DefineClass(env, "RelayHandle",
                       {
                           InstanceMethod("listen", &RelayHandle::Listen),
                           InstanceMethod("unlisten", &RelayHandle::Unlisten),
                           InstanceMethod("connect", &RelayHandle::Connect),
                           InstanceMethod("abort", &RelayHandle::Abort),
                           InstanceMethod("peer6", &RelayHandle::Peer6),
                           InstanceMethod("start", &RelayHandle::Start),
                           InstanceMethod("close", &RelayHandle::CloseConn),
                           InstanceMethod("reset", &RelayHandle::ResetConn),
                           InstanceMethod("refuse", &RelayHandle::Refuse),
                           InstanceMethod("activity", &RelayHandle::Activity),
                           InstanceMethod("stats", &RelayHandle::Stats),
                           InstanceMethod("destroy", &RelayHandle::Destroy),
                       });
  }

  // new RelayHandle(callback(count), events: Float64Array, activity: Float64Array)
  explicit RelayHandle(const Napi::CallbackInfo& info) : Napi::ObjectWrap<RelayHandle>(info) {
    Napi::Env env = info.Env();
    if (info.Length() < 3 || !info[0].IsFunction() || !info[1].IsTypedArray() || !info[2].IsTypedArray()) {
      throw Napi::TypeError::New(env, "RelayHandle(callback, events: Float64Array, activity: Float64Array)");
    }
    Napi::TypedArray ev = info[1].As<Napi::TypedArray>();
    Napi::TypedArray act = info[2].As<Napi::TypedArray>();
    if (ev.TypedArrayType() != napi_float64_array || act.TypedArrayType() != napi_float64_array) {
      throw Napi::TypeError::New(env, "events and activity must be Float64Arrays");
    }
    if (ev.ElementLength() < kRecordSize * 16 || act.ElementLength() < 3 * 16) {
      throw Napi::RangeError::New(env, "events must hold at least 16 records of 5, activity 16 of 3");
    }
    ev_capacity_ = static_cast<int>(ev.ElementLength() / kRecordSize);
    act_capacity_ = static_cast<int>(act.ElementLength() / 3);
    callback_ = Napi::Persistent(info[0].As<Napi::Function>());
    events_ref_ = Napi::Persistent(info[1].As<Napi::Float64Array>());
    activity_ref_ = Napi::Persistent(info[2].As<Napi::Float64Array>());
    // Both arrays' memory stays put while the references hold them: C writes through these pointers
    // from libuv callbacks, where no handle scope is open.
    ev_ = events_ref_.Value().Data();
    act_ = activity_ref_.Value().Data();
    context_ = std::make_unique<Napi::AsyncContext>(env, "lbagent:Relay");

    epfd_ = epoll_create1(EPOLL_CLOEXEC);
    if (epfd_ < 0) throw ErrnoError(env, errno, "epoll_create1");
    // The EMFILE reserve (libuv's trick): closed to accept and drop pending clients when out of descriptors.
    reserve_ = open("/dev/null", O_RDONLY | O_CLOEXEC);
    int rc = 0;
    const char* call = nullptr;
    poll_ = StartReadPoll(env, epfd_, this, &RelayHandle::OnReadable, &rc, &call);
    if (poll_ == nullptr) {
      Release();
      throw ErrnoError(env, -rc, call);
    }
    uv_loop_t* loop = uv_handle_get_loop(reinterpret_cast<uv_handle_t*>(poll_));
    check_ = new uv_check_t;
    uv_check_init(loop, check_);
    check_->data = this;
    uv_unref(reinterpret_cast<uv_handle_t*>(check_));
    uv_check_start(check_, &RelayHandle::OnCheck);
    idle_ = new uv_idle_t;
    uv_idle_init(loop, idle_);
    idle_->data = this;
    uv_unref(reinterpret_cast<uv_handle_t*>(idle_));
    // The loop stays alive while something is listened on or relayed (see Opened/Closed).
    uv_unref(reinterpret_cast<uv_handle_t*>(poll_));
    Ref();
    polling_ = true;
    // Async, not plain: a worker thread's end once crashed here (loop_handles.h; test/forward/index.test.ts).
    teardown_.Add(env, this);
  }

  ~RelayHandle() override { Release(); }

 private:
  // ---- JavaScript's verbs ------------------------------------------------

  void CheckOpen(Napi::Env env) {
    if (epfd_ < 0) throw ErrnoError(env, EBADF, "relay handle", "closed");
  }

  // A connection's id for JavaScript: its slot and generation, so that a late call for an ended
  // connection never reaches the next one in the same slot.
  double JsId(uint32_t slot) const { return static_cast<double>(conns_[slot].gen) * kMaxConns + slot; }

  Conn* Get(const Napi::CallbackInfo& info, int arg = 0) {
    CheckOpen(info.Env());
    if (info.Length() <= static_cast<size_t>(arg) || !info[arg].IsNumber()) throw Napi::TypeError::New(info.Env(), "connection id expected");
    double v = info[arg].As<Napi::Number>().DoubleValue();
    if (!(v >= 0) || v >= 9007199254740992.0) return nullptr;
    uint64_t id = static_cast<uint64_t>(v);
    uint64_t slot = id % kMaxConns;
    if (slot >= conns_.size() || conns_[slot].state == kFree || conns_[slot].gen != id / kMaxConns) return nullptr;
    return &conns_[slot];
  }

  // listen(fd, backlog) -> listener id. Takes the descriptor over (closed by unlisten/destroy).
  Napi::Value Listen(const Napi::CallbackInfo& info) {
    Napi::Env env = info.Env();
    CheckOpen(env);
    if (info.Length() < 2 || !info[0].IsNumber() || !info[1].IsNumber()) throw Napi::TypeError::New(env, "listen(fd, backlog)");
    int fd = info[0].As<Napi::Number>().Int32Value();
    int backlog = info[1].As<Napi::Number>().Int32Value();
    // Accepted sockets inherit TCP_NODELAY from the listener: no setsockopt per connection.
    int one = 1;
    if (setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one)) < 0) throw ErrnoError(env, errno, "setsockopt", "TCP_NODELAY");
    int fl = fcntl(fd, F_GETFL);
    if (fl < 0 || fcntl(fd, F_SETFL, fl | O_NONBLOCK) < 0) throw ErrnoError(env, errno, "fcntl");
    if (listen(fd, backlog) < 0) throw ErrnoError(env, errno, "listen");
    size_t lid = 0;
    while (lid < listeners_.size() && listeners_[lid].fd >= 0) lid++;
    if (lid == listeners_.size()) listeners_.emplace_back();
    // Level-triggered: a wake-up accepts at most kAcceptsPerWake, the rest come at the next.
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.u64 = kListenerBit | lid;
    if (epoll_ctl(epfd_, EPOLL_CTL_ADD, fd, &ev) < 0) throw ErrnoError(env, errno, "epoll_ctl");
    listeners_[lid].fd = fd;
    Opened();
    return Napi::Number::New(env, static_cast<double>(lid));
  }

  // unlisten(listener id): out of the epoll set (the socket may live on in another descriptor) and closed.
  Napi::Value Unlisten(const Napi::CallbackInfo& info) {
    Napi::Env env = info.Env();
    if (epfd_ < 0) return env.Undefined();
    int64_t lid = info.Length() > 0 && info[0].IsNumber() ? info[0].As<Napi::Number>().Int64Value() : -1;
    if (lid < 0 || static_cast<uint64_t>(lid) >= listeners_.size() || listeners_[lid].fd < 0) return env.Undefined();
    CloseListener(static_cast<size_t>(lid));
    return env.Undefined();
  }

  // connect(id, address (IPv4, host order), port, address6?: Uint8Array (16 bytes, network order))
  // -> 0 in progress, or the errno (nothing left open). With address6 the backend is IPv6.
  Napi::Value Connect(const Napi::CallbackInfo& info) {
    Napi::Env env = info.Env();
    Conn* c = Get(info);
    if (info.Length() < 3 || !info[1].IsNumber() || !info[2].IsNumber()) throw Napi::TypeError::New(env, "connect(id, address, port, address6?)");
    if (c == nullptr || c->state != kWaiting || c->ufd >= 0) throw Napi::Error::New(env, "connect: no connection waiting for a backend");
    uint32_t addr = info[1].As<Napi::Number>().Uint32Value();
    uint32_t port = info[2].As<Napi::Number>().Uint32Value();
    const uint8_t* addr6 = nullptr;
    if (info.Length() > 3 && info[3].IsTypedArray()) {
      Napi::TypedArray ta = info[3].As<Napi::TypedArray>();
      if (ta.TypedArrayType() != napi_uint8_array || ta.ElementLength() != 16) throw Napi::TypeError::New(env, "connect: address6 must be a Uint8Array of 16 bytes");
      addr6 = ta.As<Napi::Uint8Array>().Data();
    }
    int fd = socket(addr6 != nullptr ? AF_INET6 : AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) return Napi::Number::New(env, errno);
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    sockaddr_in sa{};
    sockaddr_in6 sa6{};
    sockaddr* to = reinterpret_cast<sockaddr*>(&sa);
    socklen_t tolen = sizeof(sa);
    if (addr6 != nullptr) {
      sa6.sin6_family = AF_INET6;
      sa6.sin6_port = htons(static_cast<uint16_t>(port));
      memcpy(&sa6.sin6_addr, addr6, 16);
      to = reinterpret_cast<sockaddr*>(&sa6);
      tolen = sizeof(sa6);
    } else {
      sa.sin_family = AF_INET;
      sa.sin_port = htons(static_cast<uint16_t>(port));
      sa.sin_addr.s_addr = htonl(addr);
    }
    int rc = connect(fd, to, tolen);
    if (rc < 0 && errno != EINPROGRESS && errno != EINTR) {
      int err = errno;
      ::close(fd);
      return Napi::Number::New(env, err);
    }
    uint32_t id = static_cast<uint32_t>(c - conns_.data());
    if (Register(fd, id, 1, c->gen) < 0) {
      int err = errno;
      ::close(fd);
      return Napi::Number::New(env, err);
    }
    c->ufd = fd;
    c->in[1] = c->out[1] = c->hup[1] = false;
    c->state = kConnecting;
    return Napi::Number::New(env, 0);
  }

  // peer6(id, out: Uint8Array (16 bytes)) -> true with the IPv6 client's address written to out
  // (getpeername: an IPv6 accept's record has no room for it), false when there is none.
  Napi::Value Peer6(const Napi::CallbackInfo& info) {
    Napi::Env env = info.Env();
    Conn* c = Get(info);
    if (info.Length() < 2 || !info[1].IsTypedArray()) throw Napi::TypeError::New(env, "peer6(id, out: Uint8Array)");
    Napi::TypedArray ta = info[1].As<Napi::TypedArray>();
    if (ta.TypedArrayType() != napi_uint8_array || ta.ElementLength() < 16) throw Napi::TypeError::New(env, "peer6: out must be a Uint8Array of 16 bytes");
    if (c == nullptr || c->cfd < 0) return Napi::Boolean::New(env, false);
    sockaddr_in6 sa{};
    socklen_t len = sizeof(sa);
    if (getpeername(c->cfd, reinterpret_cast<sockaddr*>(&sa), &len) < 0 || sa.sin6_family != AF_INET6) return Napi::Boolean::New(env, false);
    memcpy(ta.As<Napi::Uint8Array>().Data(), &sa.sin6_addr, 16);
    return Napi::Boolean::New(env, true);
  }

  // abort(id): gives up the backend connect in flight (TypeScript's timeout); the client stays, waiting. True if there was one.
  Napi::Value Abort(const Napi::CallbackInfo& info) {
    Conn* c = Get(info);
    if (c == nullptr || c->state != kConnecting) return Napi::Boolean::New(info.Env(), false);
    ::close(c->ufd);
    c->ufd = -1;
    c->state = kWaiting;
    return Napi::Boolean::New(info.Env(), true);
  }

  // start(id, header: Buffer | undefined, headerLength): relay both ways; the header goes before the client's first bytes.
  Napi::Value Start(const Napi::CallbackInfo& info) {
    Napi::Env env = info.Env();
    Conn* c = Get(info);
    if (c == nullptr || c->state != kConnected) throw Napi::Error::New(env, "start: no connected relay with that id");
    uint32_t hlen = 0;
    if (info.Length() >= 3 && info[1].IsBuffer() && info[2].IsNumber()) {
      Napi::Buffer<char> b = info[1].As<Napi::Buffer<char>>();
      hlen = info[2].As<Napi::Number>().Uint32Value();
      if (hlen > b.Length() || hlen > 1024) throw Napi::RangeError::New(env, "start: header length");
      if (hlen > 0) {
        EnsureBuf(c->d[0]);
        memcpy(c->d[0].buf, b.Data(), hlen);
      }
    }
    c->hdr = hlen;
    c->state = kRelaying;
    uint32_t id = static_cast<uint32_t>(c - conns_.data());
    Pump(id);
    // The client has sent nothing yet: its header goes alone at the second check phase from now.
    if (conns_[id].state == kRelaying && conns_[id].gen == c->gen && conns_[id].hdr > 0) Later(id, 0);
    return env.Undefined();
  }

  // close(id): both sides closed now (a FIN, or a RST where unread data remains). No kEnd follows.
  // Returns the bytes not yet reported: [toBackend, toClient] in activity[0..1].
  Napi::Value CloseConn(const Napi::CallbackInfo& info) {
    Conn* c = Get(info);
    if (c != nullptr) Finish(static_cast<uint32_t>(c - conns_.data()), false, false, true);
    return info.Env().Undefined();
  }

  // reset(id): a RST to the client, the backend (if any) closed. No kEnd follows.
  Napi::Value ResetConn(const Napi::CallbackInfo& info) {
    Conn* c = Get(info);
    if (c != nullptr) Finish(static_cast<uint32_t>(c - conns_.data()), true, false, true);
    return info.Env().Undefined();
  }

  // refuse(id): the backend side (if any) closed, our FIN to the client, its bytes read and dropped;
  // kGone when it closes. close(id) ends it sooner (TypeScript's deadline).
  Napi::Value Refuse(const Napi::CallbackInfo& info) {
    Conn* c = Get(info);
    if (c == nullptr) return info.Env().Undefined();
    uint32_t id = static_cast<uint32_t>(c - conns_.data());
    if (c->ufd >= 0) {
      ::close(c->ufd);
      c->ufd = -1;
    }
    shutdown(c->cfd, SHUT_WR);
    c->state = kRefusing;
    DrainRefused(id);
    return info.Env().Undefined();
  }

  // activity() -> count: ids with traffic since the previous call, as [id, bytes to backend, to client] triples.
  Napi::Value Activity(const Napi::CallbackInfo& info) {
    double* out = act_;
    int n = 0;
    while (!dirty_.empty() && n < act_capacity_) {
      uint32_t id = dirty_.back();
      dirty_.pop_back();
      Conn& c = conns_[id];
      if (!c.dirty) continue;
      c.dirty = false;
      out[n * 3] = JsId(id);
      out[n * 3 + 1] = c.d[0].bytes - c.d[0].reported;
      out[n * 3 + 2] = c.d[1].bytes - c.d[1].reported;
      c.d[0].reported = c.d[0].bytes;
      c.d[1].reported = c.d[1].bytes;
      n++;
    }
    return Napi::Number::New(info.Env(), n);
  }

  Napi::Value Stats(const Napi::CallbackInfo& info) {
    Napi::Env env = info.Env();
    Napi::Object o = Napi::Object::New(env);
    o.Set("connections", Napi::Number::New(env, static_cast<double>(live_)));
    o.Set("listeners", Napi::Number::New(env, static_cast<double>(open_ - live_)));
    o.Set("buffers", Napi::Number::New(env, static_cast<double>(bufs_out_)));
    o.Set("wakes", Napi::Number::New(env, static_cast<double>(wakes_)));
    o.Set("extraPasses", Napi::Number::New(env, static_cast<double>(extra_passes_)));
    return o;
  }

  Napi::Value Destroy(const Napi::CallbackInfo& info) {
    Release();
    callback_.Reset();
    return info.Env().Undefined();
  }

  // ---- connections -------------------------------------------------------

  int Register(int fd, uint32_t id, uint32_t side, uint32_t gen) {
    epoll_event ev{};
    ev.events = EPOLLIN | EPOLLOUT | EPOLLRDHUP | EPOLLET;
    ev.data.u64 = (static_cast<uint64_t>(gen) << 32) | (static_cast<uint64_t>(id) << 1) | side;
    return epoll_ctl(epfd_, EPOLL_CTL_ADD, fd, &ev);
  }

  uint32_t NewConn() {
    uint32_t id;
    if (!free_ids_.empty()) {
      id = free_ids_.back();
      free_ids_.pop_back();
    } else {
      if (conns_.size() >= kMaxConns) return UINT32_MAX;
      id = static_cast<uint32_t>(conns_.size());
      conns_.emplace_back();
    }
    Conn& c = conns_[id];
    uint32_t gen = c.gen + 1;
    c = Conn();
    c.gen = gen & 0x7fffffff;
    return id;
  }

  void EnsureBuf(Dir& d) {
    if (d.buf != nullptr) return;
    if (!free_bufs_.empty()) {
      d.buf = free_bufs_.back();
      free_bufs_.pop_back();
    } else {
      d.buf = static_cast<char*>(malloc(kBufSize));
      if (d.buf == nullptr) abort();
    }
    bufs_out_++;
  }

  void PutBuf(Dir& d) {
    if (d.buf == nullptr) return;
    if (free_bufs_.size() < kFreeBufsMax) free_bufs_.push_back(d.buf);
    else free(d.buf);
    d.buf = nullptr;
    bufs_out_--;
  }

  void MarkDirty(uint32_t id, Conn& c) {
    if (c.dirty) return;
    c.dirty = true;
    dirty_.push_back(id);
  }

  // Ends a connection: closes both descriptors (RST on the client with resetClient, on both with
  // resetBoth), reports kEnd with `err` unless TypeScript asked (quiet).
  void Finish(uint32_t id, bool resetClient, bool resetBoth, bool quiet, int err = 0) {
    Conn& c = conns_[id];
    if (c.state == kFree) return;
    linger lg{1, 0};
    if (c.cfd >= 0) {
      if (resetClient || resetBoth) setsockopt(c.cfd, SOL_SOCKET, SO_LINGER, &lg, sizeof(lg));
      ::close(c.cfd);
    }
    if (c.ufd >= 0) {
      if (resetBoth) setsockopt(c.ufd, SOL_SOCKET, SO_LINGER, &lg, sizeof(lg));
      ::close(c.ufd);
    }
    double tb = c.d[0].bytes - c.d[0].reported;
    double tc = c.d[1].bytes - c.d[1].reported;
    // Every piece of bookkeeping before Emit: a full record array makes Emit
    // call JavaScript, whose close(id) must then find this slot already free
    // (not close its descriptors and count it a second time).
    PutBuf(c.d[0]);
    PutBuf(c.d[1]);
    c.state = kFree;
    c.cfd = c.ufd = -1;
    c.dirty = false;
    free_ids_.push_back(id);
    live_--;
    Closed();
    if (quiet) {
      // The caller reads what was not reported yet from activity[0..1].
      act_[0] = tb;
      act_[1] = tc;
    } else {
      Emit(kEnd, id, err, tb, tc);
    }
  }

  void Fail(uint32_t id, int err) { Finish(id, false, true, false, err); }

  // Moves what is ready in both directions; ends the connection when both sides are done.
  void Pump(uint32_t id) {
    if (!PumpDir(id, 0)) return;
    if (!PumpDir(id, 1)) return;
    Conn& c = conns_[id];
    bool cDone = c.d[0].eof && c.d[0].start == c.d[0].end;
    bool uDone = c.d[1].eof && c.d[1].start == c.d[1].end;
    if (cDone && uDone) {
      Finish(id, false, false, false, 0);
      return;
    }
    if (cDone && !c.d[0].shut) {
      c.d[0].shut = true;
      Later(id, 1);
    }
    if (uDone && !c.d[1].shut) {
      c.d[1].shut = true;
      Later(id, 2);
    }
  }

  // One direction: write what is pending, read more while the destination takes it. False: the connection ended.
  bool PumpDir(uint32_t id, int dir) {
    Conn& c = conns_[id];
    Dir& d = c.d[dir];
    int src = dir == 0 ? c.cfd : c.ufd;
    int dst = dir == 0 ? c.ufd : c.cfd;
    int si = dir;
    int di = dir ^ 1;
    for (;;) {
      if (d.end > d.start) {
        if (!c.out[di]) return true;
        ssize_t n = send(dst, d.buf + d.start, d.end - d.start, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (n < 0) {
          if (errno == EINTR) continue;
          if (errno == EAGAIN || errno == EWOULDBLOCK) {
            c.out[di] = false;
            return true;
          }
          Fail(id, errno);
          return false;
        }
        d.start += static_cast<uint32_t>(n);
        if (d.start < d.end) {
          // A short write: the socket's buffer is full; EPOLLOUT resumes it (and the reading side).
          c.out[di] = false;
          return true;
        }
        d.start = d.end = 0;
      }
      if (d.eof || !c.in[si]) return true;
      EnsureBuf(d);
      uint32_t off = dir == 0 ? c.hdr : 0;
      ssize_t n = recv(src, d.buf + off, kBufSize - off, MSG_DONTWAIT);
      if (n > 0) {
        d.bytes += static_cast<double>(n);
        MarkDirty(id, c);
        d.start = 0;
        d.end = off + static_cast<uint32_t>(n);
        if (off > 0) {
          c.hdr = 0;
          Emit(kHeader, id, 1, 0, 0);
          // Emit may have run JavaScript (a full record array), which may have closed this connection.
          if (c.state != kRelaying) return false;
        }
        if (static_cast<uint32_t>(n) < kBufSize - off && !c.hup[si]) c.in[si] = false;
        continue;
      }
      if (n == 0) {
        d.eof = true;
        c.in[si] = false;
        // A client that ends without a byte: the backend still gets its header, then the FIN.
        if (off > 0 && !HeaderAlone(id)) return false;
        continue;
      }
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) {
        c.in[si] = false;
        return true;
      }
      Fail(id, errno);
      return false;
    }
  }

  // The PROXY header waiting in front of the client's first bytes becomes the
  // whole pending write to the backend. False: Emit ran JavaScript (a full
  // record array), which closed the connection.
  bool HeaderAlone(uint32_t id) {
    Conn& c = conns_[id];
    c.d[0].start = 0;
    c.d[0].end = c.hdr;
    c.hdr = 0;
    Emit(kHeader, id, 0, 0, 0);
    return c.state == kRelaying;
  }

  // A refused client: read and drop until its FIN or an error, then close and report kGone.
  void DrainRefused(uint32_t id) {
    Conn& c = conns_[id];
    char buf[4096];
    for (int i = 0; i < 16; i++) {
      ssize_t n = recv(c.cfd, buf, sizeof(buf), MSG_DONTWAIT);
      if (n > 0) continue;
      if (n < 0 && errno == EINTR) continue;
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
      Finish(id, false, false, true);
      Emit(kGone, id, 0, 0, 0);
      return;
    }
  }

  // ---- loop turns --------------------------------------------------------

  void Later(uint32_t id, uint8_t what) {
    turn_wait_.push_back(Turn{id, conns_[id].gen, what});
    Spin();
  }

  // Keeps the loop from blocking while turns are due or events unreported (the idle handle, as setImmediate).
  void Spin() {
    if (idle_ != nullptr && !uv_is_active(reinterpret_cast<uv_handle_t*>(idle_))) uv_idle_start(idle_, [](uv_idle_t*) {});
  }

  static void OnCheck(uv_check_t* h) {
    try {
      static_cast<RelayHandle*>(h->data)->CheckTurn();
    } catch (...) {
    }
  }

  void CheckTurn() {
    if (epfd_ < 0) return;
    in_callback_ = true;
    std::vector<Turn> due;
    due.swap(turn_last_);
    turn_last_.swap(turn_wait_);
    for (const Turn& t : due) {
      Conn& c = conns_[t.id];
      if (c.state != kRelaying || c.gen != t.gen) continue;
      if (t.what == 0) {
        // The client is silent (a server-speaks-first protocol): the header goes alone.
        if (c.hdr > 0 && HeaderAlone(t.id)) Pump(t.id);
        continue;
      }
      int fd = t.what == 1 ? c.ufd : c.cfd;
      if (shutdown(fd, SHUT_WR) < 0 && errno != ENOTCONN) Fail(t.id, errno);
    }
    Flush();
    in_callback_ = false;
    if (turn_last_.empty() && turn_wait_.empty() && ev_count_ == 0 && idle_ != nullptr) uv_idle_stop(idle_);
  }

  static void OnReadable(uv_poll_t* handle, int status, int events) {
    try {
      static_cast<RelayHandle*>(handle->data)->Drain();
    } catch (...) {
      // Nothing may unwind into libuv; JavaScript exceptions are handled in Flush.
    }
  }

  // One libuv wake-up. The relay's epoll is read, what it holds handled, and
  // read again while a read finds something, up to kDrainPasses reads: what
  // became ready while the first batch was handled (a backend's answer, the
  // next request of a keep-alive client) goes in this wake-up instead of
  // waiting for libuv's next turn, its epoll_pwait and, mostly, a sleep and
  // a wake-up of the thread. One read more per wake-up (it usually finds
  // nothing under light load); decisions still go to JavaScript once, after
  // the last read (Flush), or earlier when the record array fills.
  void Drain() {
    if (epfd_ < 0) return;
    in_callback_ = true;
    wakes_++;
    epoll_event evs[kMaxEvents];
    for (int pass = 0; pass < kDrainPasses && epfd_ >= 0; pass++) {
      int n;
      do {
        n = epoll_wait(epfd_, evs, kMaxEvents, 0);
      } while (n < 0 && errno == EINTR);
      if (n <= 0) break;
      if (pass > 0) extra_passes_++;
      for (int i = 0; i < n && epfd_ >= 0; i++) Handle(evs[i]);
    }
    Flush();
    in_callback_ = false;
  }

  void Handle(const epoll_event& ev) {
    uint64_t data = ev.data.u64;
    if (static_cast<uint32_t>(data) & kListenerBit && (data >> 32) == 0) {
      Accept(static_cast<size_t>(static_cast<uint32_t>(data) & ~kListenerBit));
      return;
    }
    uint32_t gen = static_cast<uint32_t>(data >> 32);
    uint32_t id = static_cast<uint32_t>(data & 0xffffffffu) >> 1;
    int side = static_cast<int>(data & 1);
    if (id >= conns_.size()) return;
    Conn& c = conns_[id];
    if (c.state == kFree || c.gen != gen) return;  // closed earlier in this batch
    uint32_t e = ev.events;
    if (e & (EPOLLIN | EPOLLRDHUP | EPOLLERR | EPOLLHUP)) c.in[side] = true;
    if (e & (EPOLLRDHUP | EPOLLHUP | EPOLLERR)) c.hup[side] = true;
    if (e & (EPOLLOUT | EPOLLERR | EPOLLHUP)) c.out[side] = true;
    switch (c.state) {
      case kConnecting:
        if (side == 1) Connected(id, e);
        break;
      case kRelaying:
        Pump(id);
        break;
      case kRefusing:
        if (side == 0) DrainRefused(id);
        break;
      default:
        break;  // remembered for start()
    }
  }

  void Connected(uint32_t id, uint32_t e) {
    Conn& c = conns_[id];
    int soerr = 0;
    // EPOLLOUT alone is a made connection (no getsockopt); with EPOLLERR, SO_ERROR is the errno.
    if (e & (EPOLLERR | EPOLLHUP)) {
      socklen_t len = sizeof(soerr);
      if (getsockopt(c.ufd, SOL_SOCKET, SO_ERROR, &soerr, &len) < 0) soerr = errno;
    } else if (!(e & EPOLLOUT)) {
      return;
    }
    if (soerr != 0) {
      ::close(c.ufd);
      c.ufd = -1;
      c.state = kWaiting;  // TypeScript retries on another backend or resets
    } else {
      c.state = kConnected;
    }
    Emit(kConnect, id, soerr, 0, 0);
  }

  void Accept(size_t lid) {
    if (lid >= listeners_.size() || listeners_[lid].fd < 0) return;
    int lfd = listeners_[lid].fd;
    int since_flush = 0;
    for (int i = 0; i < kAcceptsPerWake; i++) {
      sockaddr_storage ss{};
      socklen_t len = sizeof(ss);
      int fd = accept4(lfd, reinterpret_cast<sockaddr*>(&ss), &len, SOCK_NONBLOCK | SOCK_CLOEXEC);
      if (fd < 0) {
        int err = errno;
        if (err == EINTR || err == ECONNABORTED) continue;
        if (err == EAGAIN || err == EWOULDBLOCK) return;
        if ((err == EMFILE || err == ENFILE) && since_flush > 0) {
          // Clients accepted since the last hand-over are decided first (their connects meet
          // the same exhaustion and are counted as such); one more try, then the reserve.
          Flush();
          since_flush = 0;
          if (epfd_ < 0 || listeners_[lid].fd != lfd) return;
          continue;
        }
        if ((err == EMFILE || err == ENFILE) && reserve_ >= 0) {
          // Out of descriptors: accept and drop what is pending (a close the client sees), as libuv does.
          ::close(reserve_);
          reserve_ = -1;
          int dropped = 0;
          for (; dropped < kAcceptsPerWake; dropped++) {
            int dfd = accept4(lfd, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
            if (dfd < 0) break;
            ::close(dfd);
          }
          reserve_ = open("/dev/null", O_RDONLY | O_CLOEXEC);
          // accept4 takes a descriptor before it looks at the queue: at the limit it fails with
          // EMFILE even when nobody is waiting. Nobody refused, nothing to report.
          if (dropped == 0) return;
        }
        Emit(kAcceptErr, 0, static_cast<double>(lid), err, 0);
        return;
      }
      uint32_t id = NewConn();
      if (id == UINT32_MAX) {
        ::close(fd);
        Emit(kAcceptErr, 0, static_cast<double>(lid), EMFILE, 0);
        return;
      }
      Conn& c = conns_[id];
      c.cfd = fd;
      c.state = kWaiting;
      if (Register(fd, id, 0, c.gen) < 0) {
        int err = errno;
        ::close(fd);
        c.state = kFree;
        free_ids_.push_back(id);
        Emit(kAcceptErr, 0, static_cast<double>(lid), err, 0);
        return;
      }
      live_++;
      Opened();
      if (ss.ss_family == AF_INET6) {
        Emit(kAccept, id, static_cast<double>(lid), ntohs(reinterpret_cast<sockaddr_in6*>(&ss)->sin6_port), 6);
      } else {
        const sockaddr_in* sa = reinterpret_cast<sockaddr_in*>(&ss);
        double peer = static_cast<double>(ntohl(sa->sin_addr.s_addr)) * 65536.0 + ntohs(sa->sin_port);
        Emit(kAccept, id, static_cast<double>(lid), peer, 0);
      }
      if (++since_flush == kAcceptsPerFlush) {
        since_flush = 0;
        Flush();
        // TypeScript may have closed this listener, or everything.
        if (epfd_ < 0 || listeners_[lid].fd != lfd) return;
      }
    }
  }

  void Emit(int kind, uint32_t slot, double a, double b, double c) {
    double jid = kind == kAcceptErr ? 0 : JsId(slot);
    if (in_flush_) {
      // JavaScript is reading ev_: what its own calls cause goes in the next call.
      pending_.insert(pending_.end(), {static_cast<double>(kind), jid, a, b, c});
      Spin();
      return;
    }
    if (ev_count_ == ev_capacity_) Flush();
    double* r = ev_ + ev_count_ * kRecordSize;
    r[0] = kind;
    r[1] = jid;
    r[2] = a;
    r[3] = b;
    r[4] = c;
    ev_count_++;
    // Outside a libuv callback of ours (a TypeScript timer's call): the check phase reports it.
    if (!in_callback_) Spin();
  }

  // One JavaScript call with every record gathered (MakeCallback: an async
  // context, and the nextTick and microtask queues run afterwards, as after
  // any libuv callback).
  void Flush() {
    if (in_flush_ || callback_.IsEmpty()) return;
    while (ev_count_ > 0 && epfd_ >= 0) {
      Napi::Env env = Env();
      Napi::HandleScope scope(env);
      int count = ev_count_;
      in_flush_ = true;
      try {
        callback_.MakeCallback(env.Global(), {Napi::Number::New(env, count)}, *context_);
      } catch (const Napi::Error& e) {
        napi_fatal_exception(env, e.Value());
      }
      in_flush_ = false;
      ev_count_ = 0;
      if (pending_.empty()) break;
      // What the callback's calls caused waits for the check phase (its own call), not another turn.
      size_t take = std::min(pending_.size() / kRecordSize, static_cast<size_t>(ev_capacity_));
      memcpy(ev_, pending_.data(), sizeof(double) * take * kRecordSize);
      pending_.erase(pending_.begin(), pending_.begin() + static_cast<ptrdiff_t>(take * kRecordSize));
      ev_count_ = static_cast<int>(take);
      Spin();
      break;
    }
  }

  // ---- teardown ----------------------------------------------------------

  void Opened() {
    if (open_++ == 0 && poll_ != nullptr) uv_ref(reinterpret_cast<uv_handle_t*>(poll_));
  }
  void Closed() {
    if (--open_ == 0 && poll_ != nullptr) uv_unref(reinterpret_cast<uv_handle_t*>(poll_));
  }

  void CloseListener(size_t lid) {
    int fd = listeners_[lid].fd;
    listeners_[lid].fd = -1;
    // The socket may have other descriptors (the main thread's fd store): DEL before close.
    epoll_ctl(epfd_, EPOLL_CTL_DEL, fd, nullptr);
    ::close(fd);
    Closed();
  }

  // Closes every socket and listener, the libuv handles and the epoll descriptor.
  // `hook`: called from the environment's cleanup, which waits until it is removed.
  void Release(napi_async_cleanup_hook_handle hook = nullptr) {
    teardown_.Remove();
    for (Conn& c : conns_) {
      if (c.state == kFree) continue;
      if (c.cfd >= 0) ::close(c.cfd);
      if (c.ufd >= 0) ::close(c.ufd);
      free(c.d[0].buf);
      free(c.d[1].buf);
    }
    conns_.clear();
    free_ids_.clear();
    dirty_.clear();
    turn_wait_.clear();
    turn_last_.clear();
    for (size_t lid = 0; lid < listeners_.size(); lid++) {
      if (listeners_[lid].fd >= 0) {
        if (epfd_ >= 0) epoll_ctl(epfd_, EPOLL_CTL_DEL, listeners_[lid].fd, nullptr);
        ::close(listeners_[lid].fd);
        listeners_[lid].fd = -1;
      }
    }
    for (char* b : free_bufs_) free(b);
    free_bufs_.clear();
    bufs_out_ = 0;
    live_ = 0;
    open_ = 0;
    CloseHandles({reinterpret_cast<uv_handle_t*>(poll_), reinterpret_cast<uv_handle_t*>(check_), reinterpret_cast<uv_handle_t*>(idle_)}, hook);
    poll_ = nullptr;
    check_ = nullptr;
    idle_ = nullptr;
    if (epfd_ >= 0) ::close(epfd_);
    epfd_ = -1;
    if (reserve_ >= 0) ::close(reserve_);
    reserve_ = -1;
    if (polling_) {
      polling_ = false;
      Unref();
    }
  }

  int epfd_ = -1;
  int reserve_ = -1;
  uv_poll_t* poll_ = nullptr;
  uv_check_t* check_ = nullptr;
  uv_idle_t* idle_ = nullptr;
  bool polling_ = false;
  EnvTeardown teardown_;
  friend class ::lbagent::EnvTeardown;  // runs Release(hook) at the environment's teardown
  bool in_flush_ = false;
  bool in_callback_ = false;
  Napi::FunctionReference callback_;
  Napi::Reference<Napi::Float64Array> events_ref_;
  Napi::Reference<Napi::Float64Array> activity_ref_;
  std::unique_ptr<Napi::AsyncContext> context_;
  double* ev_ = nullptr;
  double* act_ = nullptr;
  int ev_count_ = 0;
  int ev_capacity_ = 0;
  int act_capacity_ = 0;
  std::vector<double> pending_;
  std::vector<Conn> conns_;
  std::vector<uint32_t> free_ids_;
  std::vector<uint32_t> dirty_;
  std::vector<Listener> listeners_;
  std::vector<char*> free_bufs_;
  std::vector<Turn> turn_wait_;
  std::vector<Turn> turn_last_;
  int64_t live_ = 0;
  int64_t open_ = 0;
  int64_t bufs_out_ = 0;
  // libuv wake-ups handled (Drain), and reads of the epoll after a wake-up's first that found something.
  uint64_t wakes_ = 0;
  uint64_t extra_passes_ = 0;
};

}  // namespace

Napi::Object InitRelay(Napi::Env env, Napi::Object exports) {
  exports.Set("RelayHandle", RelayHandle::Define(env));
  return exports;
}

}  // namespace lbagent
