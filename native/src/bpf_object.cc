// BPF objects built by clang (native/bpf/*.c, e.g. the full-NAT engine):
// libbpf opens the ELF file, applies its relocations, creates its maps
// (re-using the ones pinned under the object's pin root, see
// LIBBPF_PIN_BY_NAME) and loads its program; this file hands JavaScript the
// descriptors, nothing more. Which maps hold what, and what goes in them, is
// the TypeScript driver's (agent/net/ebpf/nat-attach.ts). Also the count of
// a map's keys (BPF_MAP_GET_NEXT_KEY), for the flow table's fill level, and pinning.
//
// libbpf is opened with dlopen() at the first load, not linked: the addon
// (and with it the agent, its proxy and its nft path) loads on a VM without
// libbpf.so.1, and there the engine's probe says that libbpf is missing.
// (Debian's libbpf.a is not position-independent code, so it cannot go into
// the shared addon either.) The build needs only libbpf's headers.
#include "common.h"

#include <bpf/bpf.h>
#include <bpf/libbpf.h>
#include <dlfcn.h>
#include <fcntl.h>
#include <linux/bpf.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdarg>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

namespace lbagent {

namespace {

// The libbpf functions this file calls, resolved from libbpf.so.1.
struct Libbpf {
#define LBA_FN(name) decltype(&::name) name = nullptr;
#define LBA_FNS(X)                                                                                             \
  X(libbpf_set_print) X(bpf_object__open_file) X(bpf_object__close) X(bpf_object__load) X(bpf_object__next_map) \
  X(bpf_object__next_program) X(bpf_map__name) X(bpf_map__set_max_entries) X(bpf_map__pin_path) X(bpf_map__type) \
  X(bpf_map__key_size) X(bpf_map__value_size) X(bpf_map__max_entries) X(bpf_map__is_internal) X(bpf_map__fd)     \
  X(bpf_program__name) X(bpf_program__fd) X(bpf_obj_get) X(bpf_obj_get_info_by_fd) X(bpf_map_get_next_key)
  LBA_FNS(LBA_FN)
#undef LBA_FN
};

// The resolved library, or the reason it is not there (dlerror's words).
const Libbpf* OpenLibbpf(std::string* why) {
  static Libbpf lib;
  static std::string failed;
  static bool tried = false;
  if (!tried) {
    tried = true;
    void* h = dlopen("libbpf.so.1", RTLD_NOW | RTLD_LOCAL);
    if (h == nullptr) {
      const char* e = dlerror();
      failed = std::string("libbpf is not installed (") + (e != nullptr ? e : "libbpf.so.1") + ")";
    } else {
#define LBA_SYM(name)                                                                          \
  if (failed.empty()) {                                                                        \
    lib.name = reinterpret_cast<decltype(lib.name)>(dlsym(h, #name));                          \
    if (lib.name == nullptr) failed = "libbpf.so.1 lacks " #name " (libbpf 1.0 or later is needed)"; \
  }
      LBA_FNS(LBA_SYM)
#undef LBA_SYM
    }
  }
  if (!failed.empty()) {
    *why = failed;
    return nullptr;
  }
  return &lib;
}

const Libbpf& Lib(Napi::Env env) {
  std::string why;
  const Libbpf* l = OpenLibbpf(&why);
  if (l == nullptr) {
    Napi::Error e = Napi::Error::New(env, why);
    e.Set("code", Napi::String::New(env, "ENOLIBBPF"));
    throw e;
  }
  return *l;
}

// libbpf's messages for the load in progress (the verifier's log among
// them); the addon's calls run on the JavaScript thread, one at a time.
std::string g_log;

int CollectLog(enum libbpf_print_level level, const char* fmt, va_list args) {
  if (level == LIBBPF_DEBUG) return 0;
  char buf[1024];
  int n = std::vsnprintf(buf, sizeof buf, fmt, args);
  if (n > 0 && g_log.size() < (1u << 20)) g_log.append(buf, std::min<size_t>(static_cast<size_t>(n), sizeof buf - 1));
  return n;
}

Napi::Error LoadError(Napi::Env env, int err, const char* what) {
  Napi::Error e = ErrnoError(env, err, "bpf", what);
  e.Set("log", Napi::String::New(env, g_log));
  return e;
}

int Dup(int fd) { return fcntl(fd, F_DUPFD_CLOEXEC, 0); }

// A pinned map whose layout differs from the object's (another build, or
// another configured size) cannot be re-used: libbpf would refuse the load.
// Its pin is removed, so that the load creates and pins a new one; the flows
// it held are forgotten. Returns whether it did.
bool UnpinIfDifferent(const Libbpf& L, struct bpf_map* map) {
  const char* path = L.bpf_map__pin_path(map);
  if (path == nullptr) return false;
  int fd = L.bpf_obj_get(path);
  if (fd < 0) return false;
  struct bpf_map_info info;
  std::memset(&info, 0, sizeof info);
  uint32_t len = sizeof info;
  bool differs = L.bpf_obj_get_info_by_fd(fd, &info, &len) != 0 || info.type != static_cast<uint32_t>(L.bpf_map__type(map)) ||
                 info.key_size != L.bpf_map__key_size(map) || info.value_size != L.bpf_map__value_size(map) ||
                 info.max_entries != L.bpf_map__max_entries(map);
  close(fd);
  if (differs) unlink(path);
  return differs;
}

// bpfObjectLoad(path, pinRoot, maxEntries: { [map]: n }) ->
//   { prog: { [name]: fd }, maps: { [name]: fd }, unpinned: string[] }
// Every descriptor is the caller's to close. On failure: an error with
// libbpf's log (`log`), nothing left open.
Napi::Value ObjectLoad(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  const char* usage = "bpfObjectLoad(path, pinRoot, maxEntries)";
  if (info.Length() < 3 || !info[0].IsString() || !info[1].IsString() || !info[2].IsObject()) throw Napi::TypeError::New(env, usage);
  std::string path = info[0].As<Napi::String>().Utf8Value();
  std::string pin_root = info[1].As<Napi::String>().Utf8Value();
  Napi::Object sizes = info[2].As<Napi::Object>();
  const Libbpf& L = Lib(env);
  g_log.clear();
  libbpf_print_fn_t old = L.libbpf_set_print(CollectLog);
  struct Restore {
    const Libbpf& l;
    libbpf_print_fn_t fn;
    ~Restore() { l.libbpf_set_print(fn); }
  } restore{L, old};

  LIBBPF_OPTS(bpf_object_open_opts, opts, .pin_root_path = pin_root.c_str());
  struct bpf_object* obj = L.bpf_object__open_file(path.c_str(), &opts);
  if (obj == nullptr) throw LoadError(env, errno, "bpf_object__open_file");
  struct Close {
    const Libbpf& l;
    struct bpf_object* o;
    ~Close() { l.bpf_object__close(o); }
  } closer{L, obj};

  Napi::Array unpinned = Napi::Array::New(env);
  for (struct bpf_map* map = L.bpf_object__next_map(obj, nullptr); map != nullptr; map = L.bpf_object__next_map(obj, map)) {
    const char* name = L.bpf_map__name(map);
    if (sizes.Has(name)) {
      Napi::Value v = sizes.Get(name);
      if (!v.IsNumber()) throw Napi::TypeError::New(env, std::string("bpfObjectLoad: maxEntries.") + name + " must be a number");
      int err = L.bpf_map__set_max_entries(map, v.As<Napi::Number>().Uint32Value());
      if (err) throw LoadError(env, -err, "bpf_map__set_max_entries");
    }
    if (UnpinIfDifferent(L, map)) unpinned.Set(unpinned.Length(), Napi::String::New(env, name));
  }
  int err = L.bpf_object__load(obj);
  if (err) throw LoadError(env, -err, "bpf_object__load");

  std::vector<int> fds;
  auto dup_or_throw = [&](int fd) {
    int d = Dup(fd);
    if (d < 0) {
      int e = errno;
      for (int f : fds) close(f);
      throw ErrnoError(env, e, "fcntl", "F_DUPFD_CLOEXEC");
    }
    fds.push_back(d);
    return d;
  };
  Napi::Object progs = Napi::Object::New(env);
  Napi::Object maps = Napi::Object::New(env);
  for (struct bpf_program* prog = L.bpf_object__next_program(obj, nullptr); prog != nullptr; prog = L.bpf_object__next_program(obj, prog))
    progs.Set(L.bpf_program__name(prog), Napi::Number::New(env, dup_or_throw(L.bpf_program__fd(prog))));
  for (struct bpf_map* map = L.bpf_object__next_map(obj, nullptr); map != nullptr; map = L.bpf_object__next_map(obj, map)) {
    // .rodata/.bss and the like are the object's own; only named maps are handed out.
    if (L.bpf_map__is_internal(map)) continue;
    maps.Set(L.bpf_map__name(map), Napi::Number::New(env, dup_or_throw(L.bpf_map__fd(map))));
  }
  Napi::Object out = Napi::Object::New(env);
  out.Set("prog", progs);
  out.Set("maps", maps);
  out.Set("unpinned", unpinned);
  return out;
}

// bpfMapCount(fd, keySize) -> how many keys the map holds now (a walk with
// BPF_MAP_GET_NEXT_KEY; entries added or removed meanwhile may or may not be
// counted).
Napi::Value MapCount(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  const char* usage = "bpfMapCount(fd, keySize)";
  if (info.Length() < 2 || !info[0].IsNumber() || !info[1].IsNumber()) throw Napi::TypeError::New(env, usage);
  int fd = info[0].As<Napi::Number>().Int32Value();
  uint32_t key_size = info[1].As<Napi::Number>().Uint32Value();
  if (key_size == 0 || key_size > 512) throw Napi::RangeError::New(env, "bpfMapCount: keySize must be 1-512");
  const Libbpf& L = Lib(env);
  std::vector<uint8_t> a(key_size), b(key_size);
  uint8_t* cur = nullptr;
  double n = 0;
  for (;;) {
    if (L.bpf_map_get_next_key(fd, cur, b.data()) != 0) {
      if (errno == ENOENT) break;
      throw ErrnoError(env, errno, "bpf", "BPF_MAP_GET_NEXT_KEY");
    }
    n++;
    a.swap(b);
    cur = a.data();
  }
  return Napi::Number::New(env, n);
}

// bpfObjPin(fd, path): BPF_OBJ_PIN of a program or map at a bpffs path.
// bpfObjGet(path) -> fd: BPF_OBJ_GET. Both are plain bpf(2) calls (no
// libbpf): a pinned program is how a later process finds the one to replace
// without CAP_SYS_ADMIN (opening by id needs it; a bpffs file needs only
// its permissions).
Napi::Value ObjPin(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  if (info.Length() < 2 || !info[0].IsNumber() || !info[1].IsString()) throw Napi::TypeError::New(env, "bpfObjPin(fd, path)");
  std::string path = info[1].As<Napi::String>().Utf8Value();
  union bpf_attr a;
  std::memset(&a, 0, sizeof a);
  a.bpf_fd = info[0].As<Napi::Number>().Uint32Value();
  a.pathname = static_cast<uint64_t>(reinterpret_cast<uintptr_t>(path.c_str()));
  if (syscall(__NR_bpf, BPF_OBJ_PIN, &a, sizeof a) < 0) throw ErrnoError(env, errno, "bpf", "BPF_OBJ_PIN");
  return env.Undefined();
}

Napi::Value ObjGet(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  if (info.Length() < 1 || !info[0].IsString()) throw Napi::TypeError::New(env, "bpfObjGet(path)");
  std::string path = info[0].As<Napi::String>().Utf8Value();
  union bpf_attr a;
  std::memset(&a, 0, sizeof a);
  a.pathname = static_cast<uint64_t>(reinterpret_cast<uintptr_t>(path.c_str()));
  long fd = syscall(__NR_bpf, BPF_OBJ_GET, &a, sizeof a);
  if (fd < 0) throw ErrnoError(env, errno, "bpf", "BPF_OBJ_GET");
  return Napi::Number::New(env, static_cast<double>(fd));
}

}  // namespace

Napi::Object InitBpfObject(Napi::Env env, Napi::Object exports) {
  exports.Set("bpfObjectLoad", Napi::Function::New(env, ObjectLoad, "bpfObjectLoad"));
  exports.Set("bpfMapCount", Napi::Function::New(env, MapCount, "bpfMapCount"));
  exports.Set("bpfObjPin", Napi::Function::New(env, ObjPin, "bpfObjPin"));
  exports.Set("bpfObjGet", Napi::Function::New(env, ObjGet, "bpfObjGet"));
  return exports;
}

}  // namespace lbagent
