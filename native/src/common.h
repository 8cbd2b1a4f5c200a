// lbagent_native: shared declarations. This addon is the syscall layer only:
// it opens, binds, configures, reads and writes file descriptors and reports
// readiness through libuv. Parsing, checksums and policy live in TypeScript
// (agent/net/*.ts); agent/net/native.ts is the only file that loads us.
#ifndef LBAGENT_NATIVE_COMMON_H_
#define LBAGENT_NATIVE_COMMON_H_

#include <napi.h>

#include <cstddef>
#include <cstdint>

namespace lbagent {

// An Error shaped like Node's own system errors: message
// "EPERM: operation not permitted, socket", and properties
// code ('EPERM'), errno (negative, as libuv and Node report it), syscall.
Napi::Error ErrnoError(Napi::Env env, int err, const char* syscall, const char* detail = nullptr);

// Largest datagram read in one call: a GRO-merged skb on a packet socket can
// exceed the MTU (up to 64 KiB of payload plus headers); a netlink dump part
// is at most 32 KiB. Longer ones are reported as truncated, with their real
// length, rather than silently cut.
constexpr size_t kSharedRecvBufferSize = 65536 + 256;
// The calling thread's receive buffer (packet_socket.cc), shared by every
// socket of that thread: a reader copies each datagram out before returning.
uint8_t* SharedRecvBuffer();

// Readers of a uv_poll (packet_socket.cc, netlink_socket.cc). A poll
// callback's status < 0: libuv turns POLLERR into UV_EBADF and stops the
// handle; the real cause is the socket's pending error (SO_ERROR: ENETDOWN on a
// packet socket whose interface went down, ENOBUFS on a netlink socket that
// overran), which this reads and clears into *read_errno ("recvmsg"). True:
// the socket works on and the caller restarts its poll; false: the poll
// itself failed (*read_errno from status, "uv_poll") and nothing is read.
bool TakePollError(int fd, int status, int* read_errno, const char** failed_call);
// Hands what a wake-up read (`items`) and the error if any to `callback`,
// by MakeCallback (an async context; the nextTick and microtask queues run
// after it, as after any libuv callback). An exception from JavaScript is
// the process's uncaught exception, as from a socket's 'data' listener.
void DeliverReads(Napi::Env env, Napi::FunctionReference& callback, Napi::AsyncContext& context, int read_errno, const char* failed_call, Napi::Value items);

Napi::Object InitNetlinkSocket(Napi::Env env, Napi::Object exports);
Napi::Object InitPacketSocket(Napi::Env env, Napi::Object exports);
Napi::Object InitIcmp6Socket(Napi::Env env, Napi::Object exports);
Napi::Object InitUnixDgram(Napi::Env env, Napi::Object exports);
Napi::Object InitSystem(Napi::Env env, Napi::Object exports);
Napi::Object InitListenSocket(Napi::Env env, Napi::Object exports);
Napi::Object InitTcpProbe(Napi::Env env, Napi::Object exports);
Napi::Object InitRelay(Napi::Env env, Napi::Object exports);
Napi::Object InitDigest(Napi::Env env, Napi::Object exports);
Napi::Object InitBpf(Napi::Env env, Napi::Object exports);
Napi::Object InitBpfObject(Napi::Env env, Napi::Object exports);
Napi::Object InitBackground(Napi::Env env, Napi::Object exports);

// Closes fd on a background thread (background.cc): for descriptors whose
// close(2) waits in the kernel (a packet socket's waits for an RCU grace
// period). The descriptor stays open, and its number taken, until then.
void CloseInBackground(int fd);

}  // namespace lbagent

#endif  // LBAGENT_NATIVE_COMMON_H_
