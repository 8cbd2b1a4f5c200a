// PacketHandle: an AF_PACKET/SOCK_RAW socket bound to one interface and one
// ethertype, with readiness from libuv (uv_poll: no thread, no busy loop).
// Whole Ethernet frames go in and out; nothing here parses them. The kernel
// facts we rely on are in packet(7).
#include "common.h"
#include "polled_socket.h"

#include <arpa/inet.h>
#include <linux/filter.h>
#include <linux/if_packet.h>
#include <net/ethernet.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>
#include <uv.h>

#include <cerrno>
#include <cstring>
#include <memory>
#include <vector>

namespace lbagent {

// The receive buffer, one per thread for every packet and netlink socket:
// each reader reads and copies every datagram out before it returns, on the
// thread that runs the socket's loop, so sockets never share it at the same
// time. One 64 KiB buffer per socket was 6.4 MiB of RSS for 100 pool VIPs.
uint8_t* SharedRecvBuffer() {
  thread_local std::vector<uint8_t> buffer(kSharedRecvBufferSize);
  return buffer.data();
}

bool TakePollError(int fd, int status, int* read_errno, const char** failed_call) {
  int soerr = 0;
  socklen_t len = sizeof(soerr);
  if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &soerr, &len) == 0 && soerr != 0) {
    *read_errno = soerr;
    *failed_call = "recvmsg";
    return true;
  }
  *read_errno = -status;
  *failed_call = "uv_poll";
  return false;
}

void DeliverReads(Napi::Env env, Napi::FunctionReference& callback, Napi::AsyncContext& context, int read_errno, const char* failed_call, Napi::Value items) {
  Napi::Value err = env.Null();
  if (read_errno != 0) err = ErrnoError(env, read_errno, failed_call).Value();
  try {
    callback.MakeCallback(env.Global(), {err, items}, context);
  } catch (const Napi::Error& e) {
    napi_fatal_exception(env, e.Value());
  }
}

namespace {

class PacketHandle : public PolledSocket<PacketHandle> {
 public:
  static constexpr const char* kName = "packet socket";
  // packet_release() waits for an RCU grace period (synchronize_net()):
  // 7-15 ms a socket here, two sockets per DHCP service.
  static constexpr bool kCloseInBackground = true;
  // Frames handed to JavaScript per readiness callback at most.
  static constexpr int kMaxReadsPerWake = 512;

  static Napi::Function Define(Napi::Env env) {
    return DefineSocket(env, "PacketHandle",
                        {
                            InstanceMethod("send", &PacketHandle::Send),
                            InstanceMethod("sendMany", &PacketHandle::SendMany),
                            InstanceMethod("attachFilter", &PacketHandle::AttachFilter),
                            InstanceMethod("addMembership", &PacketHandle::AddMembership),
                            InstanceMethod("dropMembership", &PacketHandle::DropMembership),
                            InstanceMethod("stop", &PacketHandle::Stop),
                            InstanceAccessor("fd", &PacketHandle::Fd, nullptr),
                        });
  }

  // new PacketHandle(ifindex, protocolHostOrder, filter?)
  explicit PacketHandle(const Napi::CallbackInfo& info) : PolledSocket<PacketHandle>(info) {
    Napi::Env env = info.Env();
    if (info.Length() < 2 || !info[0].IsNumber() || !info[1].IsNumber()) {
      throw Napi::TypeError::New(env, "PacketHandle(ifindex, protocol, filter?)");
    }
    int64_t ifindex = info[0].As<Napi::Number>().Int64Value();
    int64_t protocol = info[1].As<Napi::Number>().Int64Value();
    if (ifindex <= 0 || ifindex > 0x7fffffff) throw Napi::RangeError::New(env, "ifindex must be a positive integer");
    if (protocol < 0 || protocol > 0xffff) throw Napi::RangeError::New(env, "protocol must be an ethertype (0..0xffff)");
    ifindex_ = static_cast<int>(ifindex);
    protocol_ = static_cast<uint16_t>(protocol);

    std::vector<sock_filter> program;
    bool has_filter = info.Length() > 2 && !info[2].IsUndefined() && !info[2].IsNull();
    if (has_filter) program = ParseFilter(env, info[2]);

    // packet(7): a socket opened with protocol 0 receives nothing until it is
    // bound, so the filter is in place before the first frame can be queued
    // and no frame from another interface or ethertype slips in.
    OpenSocket(env, AF_PACKET, SOCK_RAW, 0);
    if (has_filter) {
      sock_fprog fprog{static_cast<unsigned short>(program.size()), program.data()};
      if (setsockopt(fd_, SOL_SOCKET, SO_ATTACH_FILTER, &fprog, sizeof(fprog)) < 0) FailAndClose(env, "setsockopt");
    }
    // PACKET_AUXDATA gives tp_status per frame: TP_STATUS_CSUMNOTREADY marks
    // frames whose checksum is left to offload (veth, virtio), which callers
    // must not drop as corrupt.
    int one = 1;
    if (setsockopt(fd_, SOL_PACKET, PACKET_AUXDATA, &one, sizeof(one)) < 0) FailAndClose(env, "setsockopt");
    sockaddr_ll addr{};
    addr.sll_family = AF_PACKET;
    addr.sll_protocol = htons(protocol_);
    addr.sll_ifindex = ifindex_;
    if (bind(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) < 0) FailAndClose(env, "bind");
    WatchTeardown(env);
  }

 private:
  static std::vector<sock_filter> ParseFilter(Napi::Env env, Napi::Value value) {
    if (!value.IsArray()) throw Napi::TypeError::New(env, "filter must be an array of [code, jt, jf, k]");
    Napi::Array arr = value.As<Napi::Array>();
    uint32_t n = arr.Length();
    if (n == 0 || n > BPF_MAXINSNS) throw Napi::RangeError::New(env, "filter must have 1..4096 instructions");
    std::vector<sock_filter> program(n);
    for (uint32_t i = 0; i < n; i++) {
      Napi::Value insn = arr.Get(i);
      if (!insn.IsArray() || insn.As<Napi::Array>().Length() != 4) {
        throw Napi::TypeError::New(env, "filter instruction must be [code, jt, jf, k]");
      }
      Napi::Array f = insn.As<Napi::Array>();
      double code = f.Get(0u).ToNumber().DoubleValue();
      double jt = f.Get(1u).ToNumber().DoubleValue();
      double jf = f.Get(2u).ToNumber().DoubleValue();
      double k = f.Get(3u).ToNumber().DoubleValue();
      if (!(code >= 0 && code <= 0xffff) || !(jt >= 0 && jt <= 0xff) || !(jf >= 0 && jf <= 0xff) ||
          !(k >= 0 && k <= 4294967295.0)) {
        throw Napi::RangeError::New(env, "filter instruction field out of range");
      }
      program[i].code = static_cast<uint16_t>(code);
      program[i].jt = static_cast<uint8_t>(jt);
      program[i].jf = static_cast<uint8_t>(jf);
      program[i].k = static_cast<uint32_t>(k);
    }
    return program;
  }


  // send(frame: Buffer, ifindex?: number): number of bytes written. ifindex:
  // the interface the frame leaves by, when not the one the socket is bound
  // to (packet(7): sendto's sockaddr_ll names the device; one socket on a
  // parent sends each macvlan's frames from that macvlan).
  Napi::Value Send(const Napi::CallbackInfo& info) {
    Napi::Env env = info.Env();
    CheckOpen(env);
    if (info.Length() < 1 || !info[0].IsBuffer()) throw Napi::TypeError::New(env, "send(frame: Buffer, ifindex?: number)");
    int out_ifindex = ifindex_;
    if (info.Length() >= 2 && !info[1].IsUndefined()) {
      if (!info[1].IsNumber()) throw Napi::TypeError::New(env, "send(frame: Buffer, ifindex?: number)");
      out_ifindex = info[1].As<Napi::Number>().Int32Value();
      if (out_ifindex <= 0) throw Napi::RangeError::New(env, "ifindex must be a positive integer");
    }
    Napi::Buffer<uint8_t> frame = info[0].As<Napi::Buffer<uint8_t>>();
    if (frame.Length() < ETH_HLEN) throw Napi::RangeError::New(env, "frame shorter than an Ethernet header");
    sockaddr_ll addr = Destination(frame.Data(), out_ifindex);
    ssize_t n;
    do {
      n = sendto(fd_, frame.Data(), frame.Length(), 0, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
    } while (n < 0 && errno == EINTR);
    if (n < 0) throw ErrnoError(env, errno, "sendto");
    return Napi::Number::New(env, static_cast<double>(n));
  }

  // sendMany(frames: Buffer, lengths: Uint32Array, first: number): the
  // frames laid end to end in `frames` (lengths[i] bytes each), from frame
  // `first` on (at most UIO_MAXIOV of them), by one sendmmsg(2) from the
  // bound interface. Returns how many were sent, at least 1; throws the errno
  // when frame `first` itself fails. sendmmsg stops at the first failure and
  // returns the count before it (its errno is lost), so the caller calls
  // again from there to learn it.
  Napi::Value SendMany(const Napi::CallbackInfo& info) {
    Napi::Env env = info.Env();
    CheckOpen(env);
    if (info.Length() < 3 || !info[0].IsBuffer() || !info[1].IsTypedArray() || !info[2].IsNumber()) {
      throw Napi::TypeError::New(env, "sendMany(frames: Buffer, lengths: Uint32Array, first: number)");
    }
    Napi::TypedArray typed = info[1].As<Napi::TypedArray>();
    if (typed.TypedArrayType() != napi_uint32_array) throw Napi::TypeError::New(env, "sendMany: lengths must be a Uint32Array");
    Napi::Buffer<uint8_t> data = info[0].As<Napi::Buffer<uint8_t>>();
    Napi::Uint32Array lengths = typed.As<Napi::Uint32Array>();
    size_t count = lengths.ElementLength();
    int64_t first = info[2].As<Napi::Number>().Int64Value();
    if (first < 0 || static_cast<size_t>(first) >= count) throw Napi::RangeError::New(env, "sendMany: first must index a frame");
    size_t offset = 0;
    for (size_t i = 0; i < count; i++) {
      if (lengths[i] < ETH_HLEN) throw Napi::RangeError::New(env, "sendMany: a frame is shorter than an Ethernet header");
      if (i < static_cast<size_t>(first)) offset += lengths[i];
    }
    size_t total = offset;
    for (size_t i = static_cast<size_t>(first); i < count; i++) total += lengths[i];
    if (total > data.Length()) throw Napi::RangeError::New(env, "sendMany: the lengths add up to more than the buffer");
    size_t batch = count - static_cast<size_t>(first);
    if (batch > UIO_MAXIOV) batch = UIO_MAXIOV;
    std::vector<sockaddr_ll> addrs(batch);
    std::vector<iovec> iovs(batch);
    std::vector<mmsghdr> msgs(batch);
    for (size_t j = 0; j < batch; j++) {
      uint8_t* frame = data.Data() + offset;
      size_t len = lengths[static_cast<size_t>(first) + j];
      addrs[j] = Destination(frame, ifindex_);
      iovs[j] = {frame, len};
      msgs[j] = {};
      msgs[j].msg_hdr.msg_name = &addrs[j];
      msgs[j].msg_hdr.msg_namelen = sizeof(sockaddr_ll);
      msgs[j].msg_hdr.msg_iov = &iovs[j];
      msgs[j].msg_hdr.msg_iovlen = 1;
      offset += len;
    }
    int n;
    do {
      n = sendmmsg(fd_, msgs.data(), static_cast<unsigned>(batch), 0);
    } while (n < 0 && errno == EINTR);
    if (n < 0) throw ErrnoError(env, errno, "sendmmsg");
    return Napi::Number::New(env, n);
  }

  // The link-layer destination of a whole frame leaving by `ifindex`: its
  // destination MAC, and its own ethertype as skb->protocol (packet(7)).
  static sockaddr_ll Destination(const uint8_t* frame, int ifindex) {
    sockaddr_ll addr{};
    addr.sll_family = AF_PACKET;
    addr.sll_ifindex = ifindex;
    std::memcpy(&addr.sll_protocol, frame + 12, 2);
    addr.sll_halen = ETH_ALEN;
    std::memcpy(addr.sll_addr, frame, ETH_ALEN);
    return addr;
  }

  // attachFilter(program): replace the socket's classic BPF filter.
  Napi::Value AttachFilter(const Napi::CallbackInfo& info) {
    Napi::Env env = info.Env();
    CheckOpen(env);
    std::vector<sock_filter> program = ParseFilter(env, info[0]);
    sock_fprog fprog{static_cast<unsigned short>(program.size()), program.data()};
    if (setsockopt(fd_, SOL_SOCKET, SO_ATTACH_FILTER, &fprog, sizeof(fprog)) < 0) {
      throw ErrnoError(env, errno, "setsockopt");
    }
    return env.Undefined();
  }

  Napi::Value Membership(const Napi::CallbackInfo& info, int option) {
    Napi::Env env = info.Env();
    CheckOpen(env);
    if (info.Length() < 1 || !info[0].IsString()) {
      throw Napi::TypeError::New(env, "membership(kind: 'multicast'|'promisc'|'allmulti', mac?: Buffer)");
    }
    std::string kind = info[0].As<Napi::String>().Utf8Value();
    packet_mreq mreq{};
    mreq.mr_ifindex = ifindex_;
    if (kind == "multicast") {
      if (info.Length() < 2 || !info[1].IsBuffer() || info[1].As<Napi::Buffer<uint8_t>>().Length() != ETH_ALEN) {
        throw Napi::TypeError::New(env, "multicast membership needs a 6-byte MAC Buffer");
      }
      mreq.mr_type = PACKET_MR_MULTICAST;
      mreq.mr_alen = ETH_ALEN;
      std::memcpy(mreq.mr_address, info[1].As<Napi::Buffer<uint8_t>>().Data(), ETH_ALEN);
    } else if (kind == "promisc") {
      mreq.mr_type = PACKET_MR_PROMISC;
    } else if (kind == "allmulti") {
      mreq.mr_type = PACKET_MR_ALLMULTI;
    } else {
      throw Napi::TypeError::New(env, "unknown membership kind");
    }
    // Memberships belong to the socket: the kernel drops them when it closes,
    // so a crash never leaves an interface promiscuous.
    if (setsockopt(fd_, SOL_PACKET, option, &mreq, sizeof(mreq)) < 0) throw ErrnoError(env, errno, "setsockopt");
    return env.Undefined();
  }
  Napi::Value AddMembership(const Napi::CallbackInfo& info) { return Membership(info, PACKET_ADD_MEMBERSHIP); }
  Napi::Value DropMembership(const Napi::CallbackInfo& info) { return Membership(info, PACKET_DROP_MEMBERSHIP); }


  // start(callback(err, frames)) (PolledSocket): frames is an array of
  // { frame: Buffer, status: number (tp_status), pktType: number, length: number }.

  Napi::Value Stop(const Napi::CallbackInfo& info) {
    StopPolling();
    return info.Env().Undefined();
  }

  Napi::Value Fd(const Napi::CallbackInfo& info) { return Napi::Number::New(info.Env(), fd_); }

  friend class PolledSocket<PacketHandle>;  // reads through Message and Item

  using Message = ReceivedFrom<sockaddr_ll, CMSG_SPACE(sizeof(tpacket_auxdata))>;

  static bool ReadOnAfter(int) { return false; }

  // { frame: Buffer, status, pktType, ifindex, length }; MSG_TRUNC: packet(7)
  // gives the frame's real length even when the buffer was shorter.
  Napi::Value Item(Napi::Env env, const Message& m, msghdr& msg, const uint8_t* data, ssize_t n, ReadError*) {
    uint32_t tp_status = 0;
    for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c != nullptr; c = CMSG_NXTHDR(&msg, c)) {
      if (c->cmsg_level == SOL_PACKET && c->cmsg_type == PACKET_AUXDATA &&
          c->cmsg_len >= CMSG_LEN(sizeof(tpacket_auxdata))) {
        tpacket_auxdata aux;
        std::memcpy(&aux, CMSG_DATA(c), sizeof(aux));
        tp_status = aux.tp_status;
      }
    }
    size_t copied = static_cast<size_t>(n) < kSharedRecvBufferSize ? static_cast<size_t>(n) : kSharedRecvBufferSize;
    Napi::Object entry = Napi::Object::New(env);
    entry.Set("frame", Napi::Buffer<uint8_t>::Copy(env, data, copied));
    entry.Set("status", Napi::Number::New(env, tp_status));
    entry.Set("pktType", Napi::Number::New(env, m.from.sll_pkttype));
    // The interface the frame was received on: on a socket bound to a
    // macvlan's parent, the macvlan the kernel handed a unicast frame to.
    entry.Set("ifindex", Napi::Number::New(env, m.from.sll_ifindex));
    entry.Set("length", Napi::Number::New(env, static_cast<double>(n)));
    return entry;
  }

  int ifindex_ = 0;
  uint16_t protocol_ = 0;
};

}  // namespace

Napi::Object InitPacketSocket(Napi::Env env, Napi::Object exports) {
  exports.Set("PacketHandle", PacketHandle::Define(env));
  return exports;
}

}  // namespace lbagent
