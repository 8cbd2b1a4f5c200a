// lbagent_native: the libuv handles a native object owns, and their
// teardown at the end of the object or of its environment (the main thread's
// exit, or a worker thread's). One home, because the teardown order is easy
// to get wrong and each object got it wrong once:
// - Node unloads an addon right after its environment's cleanup hooks have
//   run; libuv runs the close callbacks of handles closed in a hook later.
//   With a plain hook those callbacks are code of an unloaded library
//   (SIGSEGV in uv__finish_close when a worker thread ends). An async cleanup
//   hook makes Node wait until the hook is removed, which CloseHandles does
//   after the last close callback has run.
// - A uv_poll is closed before the descriptor it watches (libuv requires it).
#ifndef LBAGENT_NATIVE_LOOP_HANDLES_H_
#define LBAGENT_NATIVE_LOOP_HANDLES_H_

#include <initializer_list>

#include <node_api.h>
#include <uv.h>

namespace lbagent {

// The async cleanup hook of one object: Add once the object is set up (the
// hook then calls owner->Release(hook), which must end in CloseHandles with
// that hook; the owner declares `friend class ::lbagent::EnvTeardown`), Remove when the
// object releases itself first (close(), its destructor).
class EnvTeardown {
 public:
  template <typename T>
  void Add(napi_env env, T* owner) {
    owner_ = owner;
    release_ = &EnvTeardown::ReleaseOwner<T>;
    if (napi_add_async_cleanup_hook(env, &EnvTeardown::Run, this, &hook_) != napi_ok) hook_ = nullptr;
  }
  void Remove() {
    if (hook_ != nullptr) napi_remove_async_cleanup_hook(hook_);
    hook_ = nullptr;
  }

 private:
  template <typename T>
  static void ReleaseOwner(void* owner, napi_async_cleanup_hook_handle hook) { static_cast<T*>(owner)->Release(hook); }

  static void Run(napi_async_cleanup_hook_handle hook, void* arg) {
    auto* self = static_cast<EnvTeardown*>(arg);
    // Being run: not removed here (the owner's Remove() becomes a no-op);
    // CloseHandles removes it once the handles are closed.
    self->hook_ = nullptr;
    self->release_(self->owner_, hook);
  }

  napi_async_cleanup_hook_handle hook_ = nullptr;
  void* owner_ = nullptr;
  void (*release_)(void* owner, napi_async_cleanup_hook_handle hook) = nullptr;
};

namespace loop_handles_detail {

struct Closing {
  int left = 0;
  napi_async_cleanup_hook_handle hook = nullptr;
};

inline void Done(Closing* closing) {
  if (closing->hook != nullptr) napi_remove_async_cleanup_hook(closing->hook);
  delete closing;
}

inline void Closed(uv_handle_t* h) {
  auto* closing = static_cast<Closing*>(h->data);
  switch (h->type) {
    case UV_POLL: delete reinterpret_cast<uv_poll_t*>(h); break;
    case UV_CHECK: delete reinterpret_cast<uv_check_t*>(h); break;
    case UV_IDLE: delete reinterpret_cast<uv_idle_t*>(h); break;
    case UV_TIMER: delete reinterpret_cast<uv_timer_t*>(h); break;
    default: break;
  }
  if (--closing->left == 0) Done(closing);
}

}  // namespace loop_handles_detail

// A uv_poll for readability of `fd`, started, its data `data`. On failure:
// nullptr, *err the libuv error and *call the libuv function that failed.
inline uv_poll_t* StartReadPoll(napi_env env, int fd, void* data, uv_poll_cb cb, int* err, const char** call) {
  uv_loop_t* loop = nullptr;
  if (napi_get_uv_event_loop(env, &loop) != napi_ok || loop == nullptr) {
    *err = UV_EINVAL;
    *call = "napi_get_uv_event_loop";
    return nullptr;
  }
  auto* poll = new uv_poll_t;
  int rc = uv_poll_init(loop, poll, fd);
  if (rc < 0) {
    delete poll;
    *err = rc;
    *call = "uv_poll_init";
    return nullptr;
  }
  poll->data = data;
  rc = uv_poll_start(poll, UV_READABLE, cb);
  if (rc < 0) {
    // Initialised: it can only go through uv_close.
    poll->data = new loop_handles_detail::Closing{1, nullptr};
    uv_close(reinterpret_cast<uv_handle_t*>(poll), &loop_handles_detail::Closed);
    *err = rc;
    *call = "uv_poll_start";
    return nullptr;
  }
  return poll;
}

// Stops and closes `handles` (each allocated with new; null ones are
// skipped), and removes `hook` - the async cleanup hook being run, or null -
// once all their close callbacks have run. The caller forgets the handles.
inline void CloseHandles(std::initializer_list<uv_handle_t*> handles, napi_async_cleanup_hook_handle hook) {
  auto* closing = new loop_handles_detail::Closing{0, hook};
  for (uv_handle_t* h : handles) {
    if (h == nullptr) continue;
    switch (h->type) {
      case UV_POLL: uv_poll_stop(reinterpret_cast<uv_poll_t*>(h)); break;
      case UV_CHECK: uv_check_stop(reinterpret_cast<uv_check_t*>(h)); break;
      case UV_IDLE: uv_idle_stop(reinterpret_cast<uv_idle_t*>(h)); break;
      case UV_TIMER: uv_timer_stop(reinterpret_cast<uv_timer_t*>(h)); break;
      default: break;
    }
    h->data = closing;
    closing->left++;
    uv_close(h, &loop_handles_detail::Closed);
  }
  if (closing->left == 0) loop_handles_detail::Done(closing);
}

}  // namespace lbagent

#endif  // LBAGENT_NATIVE_LOOP_HANDLES_H_
