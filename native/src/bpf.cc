// bpf(2) wrappers (direct server return at tc ingress): map create,
// update, lookup and delete (one entry, or many in one call: the batch
// commands), program load, tcx attach/detach/query, program ids to
// descriptors and names, test runs; and the one computation over what a
// batch lookup read, a per-CPU map's values summed over the CPUs
// (bpfSumPerCpu). Syscalls and descriptors only: the program's
// instructions are built in TypeScript (agent/net/ebpf.ts), keys and values
// are opaque bytes here, and the caller closes every descriptor it gets
// (fs.closeSync). Errors read like Node's ({ code, errno, syscall }); a
// refused BPF_PROG_LOAD carries the verifier's log as `log`.
#include "common.h"

#include <linux/bpf.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

namespace lbagent {

namespace {

// target_fd: the ifindex for tcx attachments (union target_ifindex in newer
// uapi headers than this build host's; same member).
long SysBpf(int cmd, union bpf_attr* attr) {
  return syscall(__NR_bpf, cmd, attr, sizeof(*attr));
}

uint64_t Ptr(const void* p) { return static_cast<uint64_t>(reinterpret_cast<uintptr_t>(p)); }

uint32_t U32(const Napi::CallbackInfo& info, size_t i, const char* usage) {
  if (info.Length() <= i || !info[i].IsNumber()) throw Napi::TypeError::New(info.Env(), usage);
  return info[i].As<Napi::Number>().Uint32Value();
}

Napi::Buffer<uint8_t> Bytes(const Napi::CallbackInfo& info, size_t i, const char* usage) {
  if (info.Length() <= i || !info[i].IsBuffer()) throw Napi::TypeError::New(info.Env(), usage);
  return info[i].As<Napi::Buffer<uint8_t>>();
}

void Name(char* out, size_t size, const Napi::CallbackInfo& info, size_t i) {
  if (info.Length() <= i || !info[i].IsString()) return;
  std::string s = info[i].As<Napi::String>().Utf8Value();
  std::strncpy(out, s.c_str(), size - 1);
}

// bpfMapCreate(type, keySize, valueSize, maxEntries, name?) -> fd
Napi::Value MapCreate(const Napi::CallbackInfo& info) {
  const char* usage = "bpfMapCreate(type, keySize, valueSize, maxEntries, name?)";
  union bpf_attr a;
  std::memset(&a, 0, sizeof a);
  a.map_type = U32(info, 0, usage);
  a.key_size = U32(info, 1, usage);
  a.value_size = U32(info, 2, usage);
  a.max_entries = U32(info, 3, usage);
  Name(a.map_name, sizeof a.map_name, info, 4);
  long fd = SysBpf(BPF_MAP_CREATE, &a);
  if (fd < 0) throw ErrnoError(info.Env(), errno, "bpf", "BPF_MAP_CREATE");
  return Napi::Number::New(info.Env(), static_cast<double>(fd));
}

// bpfMapUpdate(fd, key, value, flags) (BPF_ANY = 0)
Napi::Value MapUpdate(const Napi::CallbackInfo& info) {
  const char* usage = "bpfMapUpdate(fd, key: Buffer, value: Buffer, flags)";
  union bpf_attr a;
  std::memset(&a, 0, sizeof a);
  Napi::Buffer<uint8_t> key = Bytes(info, 1, usage);
  Napi::Buffer<uint8_t> value = Bytes(info, 2, usage);
  a.map_fd = U32(info, 0, usage);
  a.key = Ptr(key.Data());
  a.value = Ptr(value.Data());
  a.flags = U32(info, 3, usage);
  if (SysBpf(BPF_MAP_UPDATE_ELEM, &a) < 0) throw ErrnoError(info.Env(), errno, "bpf", "BPF_MAP_UPDATE_ELEM");
  return info.Env().Undefined();
}

// bpfMapLookup(fd, key, out): fills `out` (the value's size); false on ENOENT.
Napi::Value MapLookup(const Napi::CallbackInfo& info) {
  const char* usage = "bpfMapLookup(fd, key: Buffer, out: Buffer)";
  union bpf_attr a;
  std::memset(&a, 0, sizeof a);
  Napi::Buffer<uint8_t> key = Bytes(info, 1, usage);
  Napi::Buffer<uint8_t> out = Bytes(info, 2, usage);
  a.map_fd = U32(info, 0, usage);
  a.key = Ptr(key.Data());
  a.value = Ptr(out.Data());
  if (SysBpf(BPF_MAP_LOOKUP_ELEM, &a) < 0) {
    if (errno == ENOENT) return Napi::Boolean::New(info.Env(), false);
    throw ErrnoError(info.Env(), errno, "bpf", "BPF_MAP_LOOKUP_ELEM");
  }
  return Napi::Boolean::New(info.Env(), true);
}

// bpfMapDelete(fd, key): false on ENOENT (nothing to delete).
Napi::Value MapDelete(const Napi::CallbackInfo& info) {
  const char* usage = "bpfMapDelete(fd, key: Buffer)";
  union bpf_attr a;
  std::memset(&a, 0, sizeof a);
  Napi::Buffer<uint8_t> key = Bytes(info, 1, usage);
  a.map_fd = U32(info, 0, usage);
  a.key = Ptr(key.Data());
  if (SysBpf(BPF_MAP_DELETE_ELEM, &a) < 0) {
    if (errno == ENOENT) return Napi::Boolean::New(info.Env(), false);
    throw ErrnoError(info.Env(), errno, "bpf", "BPF_MAP_DELETE_ELEM");
  }
  return Napi::Boolean::New(info.Env(), true);
}

// bpfMapUpdateBatch(fd, keys, values, count, flags) -> count: BPF_MAP_UPDATE_BATCH
// (Linux 5.6) of `count` entries, keys and values packed back to back (a
// per-CPU map's value: one slot of round_up(value_size, 8) per possible CPU).
// The kernel writes them one after another in the order given and stops at
// the first it refuses; the error then carries `count`, the entries written.
Napi::Value MapUpdateBatch(const Napi::CallbackInfo& info) {
  const char* usage = "bpfMapUpdateBatch(fd, keys: Buffer, values: Buffer, count, flags)";
  union bpf_attr a;
  std::memset(&a, 0, sizeof a);
  Napi::Buffer<uint8_t> keys = Bytes(info, 1, usage);
  Napi::Buffer<uint8_t> values = Bytes(info, 2, usage);
  a.batch.map_fd = U32(info, 0, usage);
  a.batch.keys = Ptr(keys.Data());
  a.batch.values = Ptr(values.Data());
  a.batch.count = U32(info, 3, usage);
  a.batch.elem_flags = U32(info, 4, usage);
  if (a.batch.count == 0) return Napi::Number::New(info.Env(), 0);
  if (SysBpf(BPF_MAP_UPDATE_BATCH, &a) < 0) {
    Napi::Error e = ErrnoError(info.Env(), errno, "bpf", "BPF_MAP_UPDATE_BATCH");
    e.Set("count", Napi::Number::New(info.Env(), a.batch.count));
    throw e;
  }
  return Napi::Number::New(info.Env(), a.batch.count);
}

// bpfMapLookupBatch(fd, inBatch: Buffer | null, outBatch, keys, values, count)
// -> { count, more }: BPF_MAP_LOOKUP_BATCH of up to `count` entries from the
// position `inBatch` names (null: the map's start), packed into keys and
// values as bpfMapUpdateBatch takes them; `outBatch` receives the position
// to go on from (an array map's: a u32 index). `more` is false once the
// map's end is reached (ENOENT, with the last entries read).
Napi::Value MapLookupBatch(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  const char* usage = "bpfMapLookupBatch(fd, inBatch: Buffer | null, outBatch: Buffer, keys: Buffer, values: Buffer, count)";
  union bpf_attr a;
  std::memset(&a, 0, sizeof a);
  a.batch.map_fd = U32(info, 0, usage);
  if (info.Length() > 1 && info[1].IsBuffer()) a.batch.in_batch = Ptr(info[1].As<Napi::Buffer<uint8_t>>().Data());
  else if (info.Length() <= 1 || !info[1].IsNull()) throw Napi::TypeError::New(env, usage);
  Napi::Buffer<uint8_t> out_batch = Bytes(info, 2, usage);
  Napi::Buffer<uint8_t> keys = Bytes(info, 3, usage);
  Napi::Buffer<uint8_t> values = Bytes(info, 4, usage);
  a.batch.out_batch = Ptr(out_batch.Data());
  a.batch.keys = Ptr(keys.Data());
  a.batch.values = Ptr(values.Data());
  a.batch.count = U32(info, 5, usage);
  bool more = true;
  if (SysBpf(BPF_MAP_LOOKUP_BATCH, &a) < 0) {
    if (errno != ENOENT) throw ErrnoError(env, errno, "bpf", "BPF_MAP_LOOKUP_BATCH");
    more = false;
  }
  Napi::Object r = Napi::Object::New(env);
  r.Set("count", Napi::Number::New(env, a.batch.count));
  r.Set("more", Napi::Boolean::New(env, more));
  return r;
}

// bpfSumPerCpu(values: Buffer, count, cpuSize, cpus, offsets: Uint32Array,
// out: Float64Array): the per-CPU values of `count` entries of a per-CPU
// map, as BPF_MAP_LOOKUP_BATCH packs them (entry after entry, each `cpus`
// slots of `cpuSize` bytes), summed over the CPUs: for entry i and field j
// (a u64 at offsets[j] of a slot), out[i * offsets.length + j]. Summed as
// u64, then made a double: exact up to 2^53, as JavaScript's Number() of the
// same sum. No syscall: it spares the caller a BigInt per CPU, field and
// entry (tens of thousands a scrape at a thousand services).
Napi::Value SumPerCpu(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  const char* usage = "bpfSumPerCpu(values: Buffer, count, cpuSize, cpus, offsets: Uint32Array, out: Float64Array)";
  Napi::Buffer<uint8_t> values = Bytes(info, 0, usage);
  uint32_t count = U32(info, 1, usage);
  uint32_t cpu_size = U32(info, 2, usage);
  uint32_t cpus = U32(info, 3, usage);
  if (info.Length() < 6 || !info[4].IsTypedArray() || !info[5].IsTypedArray()) throw Napi::TypeError::New(env, usage);
  Napi::TypedArray offs_any = info[4].As<Napi::TypedArray>();
  Napi::TypedArray out_any = info[5].As<Napi::TypedArray>();
  if (offs_any.TypedArrayType() != napi_uint32_array || out_any.TypedArrayType() != napi_float64_array) throw Napi::TypeError::New(env, usage);
  Napi::Uint32Array offsets = info[4].As<Napi::Uint32Array>();
  Napi::Float64Array out = info[5].As<Napi::Float64Array>();
  size_t fields = offsets.ElementLength();
  for (size_t j = 0; j < fields; j++) {
    if (static_cast<uint64_t>(offsets[j]) + 8 > cpu_size) throw Napi::RangeError::New(env, "bpfSumPerCpu: a field offset + 8 lies past cpuSize");
  }
  uint64_t entry = static_cast<uint64_t>(cpu_size) * cpus;
  if (entry * count > values.Length()) throw Napi::RangeError::New(env, "bpfSumPerCpu: values holds fewer than count entries of cpus x cpuSize bytes");
  if (static_cast<uint64_t>(count) * fields > out.ElementLength()) throw Napi::RangeError::New(env, "bpfSumPerCpu: out holds fewer than count x offsets.length numbers");
  const uint8_t* base = values.Data();
  double* o = out.Data();
  for (uint32_t i = 0; i < count; i++) {
    const uint8_t* e = base + entry * i;
    for (size_t j = 0; j < fields; j++) {
      uint64_t sum = 0;
      for (uint32_t c = 0; c < cpus; c++) {
        uint64_t v;
        // memcpy: the slots are 8-byte aligned in the kernel's copy, not necessarily in the Buffer.
        std::memcpy(&v, e + static_cast<uint64_t>(c) * cpu_size + offsets[j], sizeof v);
        sum += v;
      }
      o[static_cast<size_t>(i) * fields + j] = static_cast<double>(sum);
    }
  }
  return env.Undefined();
}

// bpfProgLoad(type, insns, license, name, logSize) -> fd. On failure the
// error carries the verifier's log (`log`), which says which instruction and why.
Napi::Value ProgLoad(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  const char* usage = "bpfProgLoad(type, insns: Buffer, license, name, logSize)";
  Napi::Buffer<uint8_t> insns = Bytes(info, 1, usage);
  if (insns.Length() % 8 != 0) throw Napi::TypeError::New(env, "bpfProgLoad: insns must be whole 8-byte instructions");
  if (info.Length() < 3 || !info[2].IsString()) throw Napi::TypeError::New(env, usage);
  std::string license = info[2].As<Napi::String>().Utf8Value();
  uint32_t log_size = info.Length() > 4 && info[4].IsNumber() ? info[4].As<Napi::Number>().Uint32Value() : 0;
  std::vector<char> log(log_size > 0 ? log_size : 1, '\0');
  union bpf_attr a;
  std::memset(&a, 0, sizeof a);
  a.prog_type = U32(info, 0, usage);
  a.insns = Ptr(insns.Data());
  a.insn_cnt = static_cast<uint32_t>(insns.Length() / 8);
  a.license = Ptr(license.c_str());
  Name(a.prog_name, sizeof a.prog_name, info, 3);
  // No log on the first try: a log level makes the verifier slower, and a
  // too-small buffer fails an otherwise good load (ENOSPC).
  long fd = SysBpf(BPF_PROG_LOAD, &a);
  if (fd >= 0) return Napi::Number::New(env, static_cast<double>(fd));
  int err = errno;
  if (log_size > 0) {
    a.log_buf = Ptr(log.data());
    a.log_size = log_size;
    a.log_level = 1;
    fd = SysBpf(BPF_PROG_LOAD, &a);
    if (fd >= 0) return Napi::Number::New(env, static_cast<double>(fd));
    if (errno != ENOSPC) err = errno;
  }
  Napi::Error e = ErrnoError(env, err, "bpf", "BPF_PROG_LOAD");
  log.back() = '\0';
  e.Set("log", Napi::String::New(env, log.data()));
  throw e;
}

// bpfProgAttach(ifindex, progFd, attachType, flags, replaceFd): BPF_PROG_ATTACH
// with a target ifindex (tcx). BPF_F_REPLACE with replaceFd swaps atomically.
// bpfProgDetach(ifindex, progFd, attachType): BPF_PROG_DETACH of that program.
Napi::Value AttachCall(const Napi::CallbackInfo& info, int cmd) {
  bool attach = cmd == BPF_PROG_ATTACH;
  const char* usage = attach ? "bpfProgAttach(ifindex, progFd, attachType, flags, replaceFd)" : "bpfProgDetach(ifindex, progFd, attachType)";
  union bpf_attr a;
  std::memset(&a, 0, sizeof a);
  a.target_fd = U32(info, 0, usage);
  a.attach_bpf_fd = U32(info, 1, usage);
  a.attach_type = U32(info, 2, usage);
  if (attach) {
    a.attach_flags = U32(info, 3, usage);
    a.replace_bpf_fd = U32(info, 4, usage);
  }
  if (SysBpf(cmd, &a) < 0) throw ErrnoError(info.Env(), errno, "bpf", attach ? "BPF_PROG_ATTACH" : "BPF_PROG_DETACH");
  return info.Env().Undefined();
}

Napi::Value ProgAttach(const Napi::CallbackInfo& info) { return AttachCall(info, BPF_PROG_ATTACH); }
Napi::Value ProgDetach(const Napi::CallbackInfo& info) { return AttachCall(info, BPF_PROG_DETACH); }

// bpfProgQuery(ifindex, attachType) -> program ids attached there, in order.
Napi::Value ProgQuery(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  const char* usage = "bpfProgQuery(ifindex, attachType)";
  uint32_t ifindex = U32(info, 0, usage);
  uint32_t type = U32(info, 1, usage);
  std::vector<uint32_t> ids(64);
  union bpf_attr a;
  for (int attempt = 0; attempt < 4; attempt++) {
    std::memset(&a, 0, sizeof a);
    a.query.target_fd = ifindex;
    a.query.attach_type = type;
    a.query.prog_ids = Ptr(ids.data());
    a.query.prog_cnt = static_cast<uint32_t>(ids.size());
    if (SysBpf(BPF_PROG_QUERY, &a) == 0) break;
    if (errno != ENOSPC) throw ErrnoError(env, errno, "bpf", "BPF_PROG_QUERY");
    ids.resize(a.query.prog_cnt + 16);
  }
  uint32_t n = a.query.prog_cnt < ids.size() ? a.query.prog_cnt : static_cast<uint32_t>(ids.size());
  Napi::Array out = Napi::Array::New(env, n);
  for (uint32_t i = 0; i < n; i++) out.Set(i, Napi::Number::New(env, ids[i]));
  return out;
}

// A descriptor for a program's or a map's id (prog_id and map_id share one
// union member of bpf_attr).
Napi::Value FdById(const Napi::CallbackInfo& info, int cmd, const char* usage, const char* cmd_name) {
  union bpf_attr a;
  std::memset(&a, 0, sizeof a);
  a.prog_id = U32(info, 0, usage);
  long fd = SysBpf(cmd, &a);
  if (fd < 0) throw ErrnoError(info.Env(), errno, "bpf", cmd_name);
  return Napi::Number::New(info.Env(), static_cast<double>(fd));
}

// BPF_OBJ_GET_INFO_BY_FD into `out` (a bpf_prog_info or bpf_map_info).
void ObjInfo(Napi::Env env, uint32_t fd, void* out, uint32_t len) {
  union bpf_attr a;
  std::memset(&a, 0, sizeof a);
  a.info.bpf_fd = fd;
  a.info.info_len = len;
  a.info.info = Ptr(out);
  if (SysBpf(BPF_OBJ_GET_INFO_BY_FD, &a) < 0) throw ErrnoError(env, errno, "bpf", "BPF_OBJ_GET_INFO_BY_FD");
}

// bpfProgGetFdById(id) -> fd
Napi::Value ProgGetFdById(const Napi::CallbackInfo& info) {
  return FdById(info, BPF_PROG_GET_FD_BY_ID, "bpfProgGetFdById(id)", "BPF_PROG_GET_FD_BY_ID");
}

// bpfProgInfo(fd) -> { id, type, name, mapIds }
Napi::Value ProgInfo(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  uint32_t fd = U32(info, 0, "bpfProgInfo(fd)");
  uint32_t map_ids[16] = {};
  struct bpf_prog_info pi;
  std::memset(&pi, 0, sizeof pi);
  pi.nr_map_ids = 16;
  pi.map_ids = Ptr(map_ids);
  ObjInfo(env, fd, &pi, sizeof pi);
  Napi::Object out = Napi::Object::New(env);
  out.Set("id", Napi::Number::New(env, pi.id));
  out.Set("type", Napi::Number::New(env, pi.type));
  char name[BPF_OBJ_NAME_LEN + 1] = {};
  std::memcpy(name, pi.name, BPF_OBJ_NAME_LEN);
  out.Set("name", Napi::String::New(env, name));
  uint32_t n = pi.nr_map_ids < 16 ? pi.nr_map_ids : 16;
  Napi::Array maps = Napi::Array::New(env, n);
  for (uint32_t i = 0; i < n; i++) maps.Set(i, Napi::Number::New(env, map_ids[i]));
  out.Set("mapIds", maps);
  return out;
}

// bpfMapGetFdById(id) -> fd
Napi::Value MapGetFdById(const Napi::CallbackInfo& info) {
  return FdById(info, BPF_MAP_GET_FD_BY_ID, "bpfMapGetFdById(id)", "BPF_MAP_GET_FD_BY_ID");
}

// bpfMapInfo(fd) -> { id, type, keySize, valueSize, maxEntries, name }
Napi::Value MapInfo(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  uint32_t fd = U32(info, 0, "bpfMapInfo(fd)");
  struct bpf_map_info mi;
  std::memset(&mi, 0, sizeof mi);
  ObjInfo(env, fd, &mi, sizeof mi);
  Napi::Object out = Napi::Object::New(env);
  out.Set("id", Napi::Number::New(env, mi.id));
  out.Set("type", Napi::Number::New(env, mi.type));
  out.Set("keySize", Napi::Number::New(env, mi.key_size));
  out.Set("valueSize", Napi::Number::New(env, mi.value_size));
  out.Set("maxEntries", Napi::Number::New(env, mi.max_entries));
  char name[BPF_OBJ_NAME_LEN + 1] = {};
  std::memcpy(name, mi.name, BPF_OBJ_NAME_LEN);
  out.Set("name", Napi::String::New(env, name));
  return out;
}

// bpfProgTestRun(fd, data, out, repeat) -> { retval, size, durationNs }:
// BPF_PROG_TEST_RUN runs the program on a copy of `data` (the frame), the
// result frame in `out`. The tests check a program's verdicts and counters
// with it, and the bench its cost per run.
Napi::Value ProgTestRun(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  const char* usage = "bpfProgTestRun(fd, data: Buffer, out: Buffer, repeat)";
  Napi::Buffer<uint8_t> data = Bytes(info, 1, usage);
  Napi::Buffer<uint8_t> out = Bytes(info, 2, usage);
  union bpf_attr a;
  std::memset(&a, 0, sizeof a);
  a.test.prog_fd = U32(info, 0, usage);
  a.test.data_in = Ptr(data.Data());
  a.test.data_size_in = static_cast<uint32_t>(data.Length());
  a.test.data_out = Ptr(out.Data());
  a.test.data_size_out = static_cast<uint32_t>(out.Length());
  a.test.repeat = U32(info, 3, usage);
  if (SysBpf(BPF_PROG_TEST_RUN, &a) < 0) throw ErrnoError(env, errno, "bpf", "BPF_PROG_TEST_RUN");
  Napi::Object r = Napi::Object::New(env);
  r.Set("retval", Napi::Number::New(env, a.test.retval));
  r.Set("size", Napi::Number::New(env, a.test.data_size_out));
  r.Set("durationNs", Napi::Number::New(env, a.test.duration));
  return r;
}

}  // namespace

Napi::Object InitBpf(Napi::Env env, Napi::Object exports) {
  exports.Set("bpfMapCreate", Napi::Function::New(env, MapCreate, "bpfMapCreate"));
  exports.Set("bpfMapUpdate", Napi::Function::New(env, MapUpdate, "bpfMapUpdate"));
  exports.Set("bpfMapLookup", Napi::Function::New(env, MapLookup, "bpfMapLookup"));
  exports.Set("bpfMapDelete", Napi::Function::New(env, MapDelete, "bpfMapDelete"));
  exports.Set("bpfMapUpdateBatch", Napi::Function::New(env, MapUpdateBatch, "bpfMapUpdateBatch"));
  exports.Set("bpfMapLookupBatch", Napi::Function::New(env, MapLookupBatch, "bpfMapLookupBatch"));
  exports.Set("bpfSumPerCpu", Napi::Function::New(env, SumPerCpu, "bpfSumPerCpu"));
  exports.Set("bpfProgLoad", Napi::Function::New(env, ProgLoad, "bpfProgLoad"));
  exports.Set("bpfProgAttach", Napi::Function::New(env, ProgAttach, "bpfProgAttach"));
  exports.Set("bpfProgDetach", Napi::Function::New(env, ProgDetach, "bpfProgDetach"));
  exports.Set("bpfProgQuery", Napi::Function::New(env, ProgQuery, "bpfProgQuery"));
  exports.Set("bpfProgGetFdById", Napi::Function::New(env, ProgGetFdById, "bpfProgGetFdById"));
  exports.Set("bpfProgInfo", Napi::Function::New(env, ProgInfo, "bpfProgInfo"));
  exports.Set("bpfMapGetFdById", Napi::Function::New(env, MapGetFdById, "bpfMapGetFdById"));
  exports.Set("bpfMapInfo", Napi::Function::New(env, MapInfo, "bpfMapInfo"));
  exports.Set("bpfProgTestRun", Napi::Function::New(env, ProgTestRun, "bpfProgTestRun"));
  return exports;
}

}  // namespace lbagent
