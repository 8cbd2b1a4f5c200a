// Blocking kernel calls off the event loop's thread. Two calls the agent
// makes wait for RCU grace periods inside the syscall: close(2) of a packet
// socket (packet_release() calls synchronize_net()) and RTM_DELLINK (the
// unregister waits in netdev_run_todo()). Here each took 7-15 ms; stopping
// 100 DHCP services made 99 deletions and 136 packet socket closes on the
// main thread, 3.3 s in which no timer, health check, VRRP advertisement or
// control request ran, and a reload that removed services stalled the loop
// the same way. On their own threads the waits overlap (50 deletions by 50
// `ip link del` at once: 137 ms, one after another: 1,265 ms), since the
// kernel waits outside the RTNL lock.
//
// A small pool: up to kMaxThreads threads, each started when a job finds no
// idle one and ended when the queue is empty, so an idle agent has none.
// Jobs are plain syscalls; nothing here touches JavaScript except the
// completion of deleteLink, which goes back to the loop's thread through a
// thread-safe function.
#include "common.h"

#include <dlfcn.h>
#include <linux/netlink.h>
#include <linux/rtnetlink.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <deque>
#include <functional>
#include <mutex>
#include <system_error>
#include <thread>

namespace lbagent {

namespace {

// Enough to overlap the grace periods of a large reload; each thread is one
// blocked syscall at a time, nothing runs on the CPU meanwhile.
constexpr int kMaxThreads = 16;
// A deletion's answer: the kernel always answers an RTM_DELLINK that asks for
// one, so this only bounds a kernel that does not.
constexpr int kDeleteTimeoutSeconds = 10;

std::mutex mu;
std::deque<std::function<void()>> queue;
int running = 0;      // threads alive
int idle = 0;         // of those, the ones not inside a job (each takes the next queued one)
int peak = 0;         // most threads alive at once
std::atomic<uint64_t> closes{0};
std::atomic<uint64_t> deletions{0};
std::atomic<uint64_t> threads_started{0};
std::atomic<uint64_t> inline_jobs{0};

void Work() {
  std::unique_lock<std::mutex> lock(mu);
  for (;;) {
    if (queue.empty()) {
      running--;
      idle--;
      return;
    }
    std::function<void()> job = std::move(queue.front());
    queue.pop_front();
    idle--;
    lock.unlock();
    job();
    job = nullptr;  // its captures are freed outside the lock
    lock.lock();
    idle++;
  }
}

// Node unloads an addon when the last environment that loaded it ends (a
// worker thread that alone used it): a pool thread still running, or just
// returning from its last job, would then run unmapped code (SIGSEGV,
// test/privileged/net-packet.test.ts). The first job pins the library for
// the life of the process instead.
void PinLibrary() {
  static std::once_flag once;
  std::call_once(once, []() {
    Dl_info self{};
    if (dladdr(reinterpret_cast<void*>(&PinLibrary), &self) != 0 && self.dli_fname != nullptr) {
      // RTLD_NOLOAD: the library is loaded already; RTLD_NODELETE: never unmapped.
      dlopen(self.dli_fname, RTLD_LAZY | RTLD_NOLOAD | RTLD_NODELETE);
    }
  });
}

// Runs `job` on a pool thread; on the caller's thread when no thread can be
// started (EAGAIN: the process's or the system's thread limit), so a job is
// never lost.
void Run(std::function<void()> job) {
  PinLibrary();
  {
    std::lock_guard<std::mutex> lock(mu);
    queue.push_back(std::move(job));
    // Another thread only when the queue holds more jobs than idle threads:
    // a burst of deletions gets its own threads, so their waits overlap.
    if (queue.size() <= static_cast<size_t>(idle) || running >= kMaxThreads) return;
    running++;
    idle++;
    if (running > peak) peak = running;
  }
  try {
    std::thread(Work).detach();
    threads_started++;
  } catch (const std::system_error&) {
    {
      std::lock_guard<std::mutex> lock(mu);
      running--;
      idle--;
    }
    // No thread: the queue drains here unless another thread is alive to do it.
    for (;;) {
      std::function<void()> mine;
      {
        std::lock_guard<std::mutex> lock(mu);
        if (running > 0 || queue.empty()) return;
        mine = std::move(queue.front());
        queue.pop_front();
      }
      inline_jobs++;
      mine();
    }
  }
}

// One RTM_DELLINK on a netlink socket of its own, and the kernel's answer:
// 0, or the errno it refused with (ENODEV: no such link).
int DeleteLinkNow(int ifindex) {
  int fd = socket(AF_NETLINK, SOCK_RAW | SOCK_CLOEXEC, NETLINK_ROUTE);
  if (fd < 0) return errno;
  timeval timeout{kDeleteTimeoutSeconds, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof(timeout));
  struct {
    nlmsghdr header;
    ifinfomsg link;
  } request{};
  request.header.nlmsg_len = sizeof(request);
  request.header.nlmsg_type = RTM_DELLINK;
  request.header.nlmsg_flags = NLM_F_REQUEST | NLM_F_ACK;
  request.header.nlmsg_seq = 1;
  request.link.ifi_family = AF_UNSPEC;
  request.link.ifi_index = ifindex;
  sockaddr_nl kernel{};
  kernel.nl_family = AF_NETLINK;
  int err = 0;
  if (sendto(fd, &request, sizeof(request), 0, reinterpret_cast<sockaddr*>(&kernel), sizeof(kernel)) < 0) {
    err = errno;
  } else {
    alignas(nlmsghdr) char buffer[8192];
    for (bool answered = false; !answered;) {
      ssize_t n = recv(fd, buffer, sizeof(buffer), 0);
      if (n < 0) {
        if (errno == EINTR) continue;
        err = errno == EAGAIN ? ETIMEDOUT : errno;
        break;
      }
      int left = static_cast<int>(n);
      for (auto* h = reinterpret_cast<nlmsghdr*>(buffer); NLMSG_OK(h, left); h = NLMSG_NEXT(h, left)) {
        if (h->nlmsg_seq != 1 || h->nlmsg_type != NLMSG_ERROR) continue;
        if (h->nlmsg_len < NLMSG_LENGTH(sizeof(nlmsgerr))) { err = EBADMSG; answered = true; break; }
        err = -reinterpret_cast<nlmsgerr*>(NLMSG_DATA(h))->error;
        answered = true;
        break;
      }
    }
  }
  close(fd);
  return err;
}

struct Deletion {
  int ifindex;
  int err = 0;
  Napi::Promise::Deferred deferred;
};

void Settle(Napi::Env env, Napi::Function, std::nullptr_t*, Deletion* d) {
  if (env != nullptr) {
    if (d->err == 0) d->deferred.Resolve(env.Undefined());
    else d->deferred.Reject(ErrnoError(env, d->err, "RTM_DELLINK").Value());
  }
  delete d;
}

using DeletionDone = Napi::TypedThreadSafeFunction<std::nullptr_t, Deletion, Settle>;

// deleteLink(ifindex): Promise<void>, rejected with an errno error (code
// ENODEV when the link is gone). The promise keeps the loop alive: a stop
// that deletes links exits after the kernel has answered for each.
Napi::Value DeleteLink(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  if (info.Length() < 1 || !info[0].IsNumber()) throw Napi::TypeError::New(env, "deleteLink(ifindex: number)");
  int64_t ifindex = info[0].As<Napi::Number>().Int64Value();
  if (ifindex <= 0 || ifindex > 0x7fffffff) throw Napi::RangeError::New(env, "ifindex must be a positive integer");
  auto* d = new Deletion{static_cast<int>(ifindex), 0, Napi::Promise::Deferred::New(env)};
  Napi::Promise promise = d->deferred.Promise();
  DeletionDone done = DeletionDone::New(env, "lbagent.deleteLink", 0, 1);
  deletions++;
  Run([d, done]() mutable {
    d->err = DeleteLinkNow(d->ifindex);
    // napi_closing: the environment is gone (process exit, worker end);
    // nothing is left to settle.
    if (done.NonBlockingCall(d) != napi_ok) delete d;
    done.Release();
  });
  return promise;
}

// backgroundStats(): what the pool has done (test/privileged/net-background.test.ts).
Napi::Value Stats(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  Napi::Object out = Napi::Object::New(env);
  std::lock_guard<std::mutex> lock(mu);
  out.Set("closes", Napi::Number::New(env, static_cast<double>(closes.load())));
  out.Set("deletions", Napi::Number::New(env, static_cast<double>(deletions.load())));
  out.Set("threadsStarted", Napi::Number::New(env, static_cast<double>(threads_started.load())));
  out.Set("inline", Napi::Number::New(env, static_cast<double>(inline_jobs.load())));
  out.Set("threads", Napi::Number::New(env, running));
  out.Set("queued", Napi::Number::New(env, static_cast<double>(queue.size())));
  out.Set("peakThreads", Napi::Number::New(env, peak));
  return out;
}

}  // namespace

void CloseInBackground(int fd) {
  if (fd < 0) return;
  closes++;
  Run([fd]() { ::close(fd); });
}

Napi::Object InitBackground(Napi::Env env, Napi::Object exports) {
  exports.Set("deleteLink", Napi::Function::New(env, DeleteLink, "deleteLink"));
  exports.Set("backgroundStats", Napi::Function::New(env, Stats, "backgroundStats"));
  return exports;
}

}  // namespace lbagent
