// Icmp6Handle: a raw ICMPv6 socket (socket(AF_INET6, SOCK_RAW,
// IPPROTO_ICMPV6)) bound to one interface, passing only the ICMPv6 types it
// is given (ICMP6_FILTER, RFC 3542 §3.2), with readiness from libuv. It
// receives what the IPv6 stack delivers locally on that interface: its
// unicast addresses and the multicast groups joined there. Unlike a packet
// socket of ETH_P_IPV6 it costs nothing on other IPv6 traffic: the kernel
// looks it up only for locally delivered ICMPv6 (raw6_local_deliver). It
// only receives; frames leave by a packet socket (a DAD probe's source ::
// is no address a raw socket can send from). The kernel facts are in
// raw(7), ipv6(7) and RFC 3542.
#include "common.h"
#include "polled_socket.h"

#include <netinet/icmp6.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#ifndef SO_BINDTOIFINDEX
#define SO_BINDTOIFINDEX 62
#endif

namespace lbagent {

namespace {

class Icmp6Handle : public PolledSocket<Icmp6Handle> {
 public:
  static constexpr const char* kName = "ICMPv6 socket";
  static constexpr bool kCloseInBackground = false;
  static constexpr int kMaxReadsPerWake = 512;

  static Napi::Function Define(Napi::Env env) {
    return DefineSocket(env, "Icmp6Handle",
                        {
                            InstanceMethod("joinGroup", &Icmp6Handle::JoinGroup),
                            InstanceMethod("leaveGroup", &Icmp6Handle::LeaveGroup),
                        });
  }

  // new Icmp6Handle(ifindex, types: number[])
  explicit Icmp6Handle(const Napi::CallbackInfo& info) : PolledSocket<Icmp6Handle>(info) {
    Napi::Env env = info.Env();
    if (info.Length() < 2 || !info[0].IsNumber() || !info[1].IsArray()) {
      throw Napi::TypeError::New(env, "Icmp6Handle(ifindex, types)");
    }
    int64_t ifindex = info[0].As<Napi::Number>().Int64Value();
    if (ifindex <= 0 || ifindex > 0x7fffffff) throw Napi::RangeError::New(env, "ifindex must be a positive integer");
    ifindex_ = static_cast<int>(ifindex);
    icmp6_filter filter;
    ICMP6_FILTER_SETBLOCKALL(&filter);
    Napi::Array types = info[1].As<Napi::Array>();
    if (types.Length() == 0) throw Napi::RangeError::New(env, "types must name at least one ICMPv6 type");
    for (uint32_t i = 0; i < types.Length(); i++) {
      double t = types.Get(i).ToNumber().DoubleValue();
      if (!(t >= 0 && t <= 255) || t != static_cast<int>(t)) throw Napi::RangeError::New(env, "an ICMPv6 type is 0..255");
      ICMP6_FILTER_SETPASS(static_cast<int>(t), &filter);
    }

    OpenSocket(env, AF_INET6, SOCK_RAW, IPPROTO_ICMPV6);
    int one = 1;
    // What was queued before the filter and the binding is skipped in Drain
    // (IPV6_PKTINFO names the interface of every message).
    if (setsockopt(fd_, IPPROTO_ICMPV6, ICMP6_FILTER, &filter, sizeof(filter)) < 0) FailAndClose(env, "setsockopt");
    if (setsockopt(fd_, SOL_SOCKET, SO_BINDTOIFINDEX, &ifindex_, sizeof(ifindex_)) < 0) FailAndClose(env, "setsockopt");
    // RFC 3542 §6: the hop limit and the destination of each message, as
    // ancillary data (RFC 4861 §7.1 judges both).
    if (setsockopt(fd_, IPPROTO_IPV6, IPV6_RECVHOPLIMIT, &one, sizeof(one)) < 0) FailAndClose(env, "setsockopt");
    if (setsockopt(fd_, IPPROTO_IPV6, IPV6_RECVPKTINFO, &one, sizeof(one)) < 0) FailAndClose(env, "setsockopt");
    WatchTeardown(env);
  }

 private:
  // joinGroup(group: Buffer of 16) / leaveGroup: IPV6_ADD_MEMBERSHIP on the
  // bound interface. The kernel holds one membership per socket and group
  // (a second join is EADDRINUSE) and drops them with the socket.
  Napi::Value Membership(const Napi::CallbackInfo& info, int option) {
    Napi::Env env = info.Env();
    CheckOpen(env);
    if (info.Length() < 1 || !info[0].IsBuffer() || info[0].As<Napi::Buffer<uint8_t>>().Length() != 16) {
      throw Napi::TypeError::New(env, "group must be a 16-byte IPv6 address Buffer");
    }
    ipv6_mreq mreq{};
    std::memcpy(&mreq.ipv6mr_multiaddr, info[0].As<Napi::Buffer<uint8_t>>().Data(), 16);
    mreq.ipv6mr_interface = static_cast<unsigned>(ifindex_);
    if (setsockopt(fd_, IPPROTO_IPV6, option, &mreq, sizeof(mreq)) < 0) throw ErrnoError(env, errno, "setsockopt");
    return env.Undefined();
  }
  Napi::Value JoinGroup(const Napi::CallbackInfo& info) { return Membership(info, IPV6_ADD_MEMBERSHIP); }
  Napi::Value LeaveGroup(const Napi::CallbackInfo& info) { return Membership(info, IPV6_DROP_MEMBERSHIP); }

  friend class PolledSocket<Icmp6Handle>;  // reads through Message and Item

  using Message = ReceivedFrom<sockaddr_in6, CMSG_SPACE(sizeof(int)) + CMSG_SPACE(sizeof(in6_pktinfo))>;

  static bool ReadOnAfter(int) { return false; }

  // start(callback(err, messages)) (PolledSocket): messages is an array of
  // { message: Buffer (from the ICMPv6 header on), src: Buffer(16),
  //   dst: Buffer(16), hopLimit: number, length: number }.
  Napi::Value Item(Napi::Env env, const Message& m, msghdr& msg, const uint8_t* data, ssize_t n, ReadError*) {
    int hop_limit = -1;
    bool have_info = false;
    in6_pktinfo pktinfo{};
    for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c != nullptr; c = CMSG_NXTHDR(&msg, c)) {
      if (c->cmsg_level != IPPROTO_IPV6) continue;
      if (c->cmsg_type == IPV6_HOPLIMIT && c->cmsg_len >= CMSG_LEN(sizeof(int))) {
        std::memcpy(&hop_limit, CMSG_DATA(c), sizeof(int));
      } else if (c->cmsg_type == IPV6_PKTINFO && c->cmsg_len >= CMSG_LEN(sizeof(in6_pktinfo))) {
        std::memcpy(&pktinfo, CMSG_DATA(c), sizeof(pktinfo));
        have_info = true;
      }
    }
    // Queued before SO_BINDTOIFINDEX took effect, or without the facts
    // RFC 4861 §7.1 needs: not this interface's to judge.
    if (!have_info || static_cast<int>(pktinfo.ipi6_ifindex) != ifindex_ || hop_limit < 0) return Napi::Value();
    size_t copied = static_cast<size_t>(n) < kSharedRecvBufferSize ? static_cast<size_t>(n) : kSharedRecvBufferSize;
    Napi::Object entry = Napi::Object::New(env);
    entry.Set("message", Napi::Buffer<uint8_t>::Copy(env, data, copied));
    entry.Set("src", Napi::Buffer<uint8_t>::Copy(env, reinterpret_cast<const uint8_t*>(&m.from.sin6_addr), 16));
    entry.Set("dst", Napi::Buffer<uint8_t>::Copy(env, reinterpret_cast<const uint8_t*>(&pktinfo.ipi6_addr), 16));
    entry.Set("hopLimit", Napi::Number::New(env, hop_limit));
    entry.Set("length", Napi::Number::New(env, static_cast<double>(n)));
    return entry;
  }

  int ifindex_ = 0;
};

}  // namespace

Napi::Object InitIcmp6Socket(Napi::Env env, Napi::Object exports) {
  exports.Set("Icmp6Handle", Icmp6Handle::Define(env));
  return exports;
}

}  // namespace lbagent
