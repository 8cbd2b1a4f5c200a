// lbagent_native module entry: registers the packet, ICMPv6 and netlink socket classes, the unix
// datagram sender (sd_notify), small system queries (capabilities, ifindex),
// the proxy's listening sockets (SO_REUSEPORT groups), and the batch TCP
// connect prober of the health checker, the proxy's byte relay, and bpf(2)
// for direct server return at tc ingress, and the kernel calls that wait
// (packet socket close, link deletion) on background threads.
#include "common.h"

static Napi::Object InitAddon(Napi::Env env, Napi::Object exports) {
  lbagent::InitPacketSocket(env, exports);
  lbagent::InitIcmp6Socket(env, exports);
  lbagent::InitNetlinkSocket(env, exports);
  lbagent::InitUnixDgram(env, exports);
  lbagent::InitSystem(env, exports);
  lbagent::InitListenSocket(env, exports);
  lbagent::InitTcpProbe(env, exports);
  lbagent::InitRelay(env, exports);
  lbagent::InitDigest(env, exports);
  lbagent::InitBpf(env, exports);
  lbagent::InitBpfObject(env, exports);
  lbagent::InitBackground(env, exports);
  return exports;
}

NODE_API_MODULE(lbagent_native, InitAddon)
