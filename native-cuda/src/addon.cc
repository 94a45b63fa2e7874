// Module entry: registers the functions declared in src/native/native.ts (RawAddon).
#include <napi.h>

#include "copy_batch.h"
#include "crc32c.h"
#include "cuda_device.h"
#include "file_io.h"
#include "host_memory.h"
#include "prefault.h"

namespace kvtier {
namespace {

Napi::Value Probe(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  const CudaProbe& p = ProbeCuda();
  Napi::Object cuda = Napi::Object::New(env);
  cuda.Set("compiled", Napi::Boolean::New(env, p.compiled));
  cuda.Set("available", Napi::Boolean::New(env, p.available));
  cuda.Set("devices", Napi::Number::New(env, p.devices));
  cuda.Set("reason", Napi::String::New(env, p.reason));
  Napi::Object out = Napi::Object::New(env);
  out.Set("host", Napi::Boolean::New(env, true));
  out.Set("pageBytes", Napi::Number::New(env, static_cast<double>(PageBytes())));
  out.Set("cuda", cuda);
  out.Set("crc32cHardware", Napi::Boolean::New(env, Crc32cHardware()));
  return out;
}

}  // namespace
}  // namespace kvtier

namespace {

Napi::Object Init(Napi::Env env, Napi::Object exports) {
  using namespace kvtier;
  exports.Set("probe", Napi::Function::New(env, Probe, "probe"));
  exports.Set("allocSlab", Napi::Function::New(env, AllocSlab, "allocSlab"));
  exports.Set("prefaultAsync", Napi::Function::New(env, PrefaultAsync, "prefaultAsync"));
  exports.Set("mapFile", Napi::Function::New(env, MapFile, "mapFile"));
  exports.Set("addressOf", Napi::Function::New(env, AddressOf, "addressOf"));
  exports.Set("copyBatch", Napi::Function::New(env, CopyBatch, "copyBatch"));
  exports.Set("copyBatchStrided", Napi::Function::New(env, CopyBatchStrided, "copyBatchStrided"));
  exports.Set("cudaDeviceUuids", Napi::Function::New(env, CudaDeviceUuids, "cudaDeviceUuids"));
  exports.Set("cudaIpcOpen", Napi::Function::New(env, CudaIpcOpen, "cudaIpcOpen"));
  exports.Set("cudaIpcClose", Napi::Function::New(env, CudaIpcClose, "cudaIpcClose"));
  exports.Set("cudaIpcGetHandle", Napi::Function::New(env, CudaIpcGetHandle, "cudaIpcGetHandle"));
  exports.Set("cudaMalloc", Napi::Function::New(env, CudaMalloc, "cudaMalloc"));
  exports.Set("cudaFree", Napi::Function::New(env, CudaFree, "cudaFree"));
  exports.Set("copyBatchDevice", Napi::Function::New(env, CopyBatchDevice, "copyBatchDevice"));
  exports.Set("deviceCopyCounts", Napi::Function::New(env, DeviceCopyCounts, "deviceCopyCounts"));
  exports.Set("crc32c", Napi::Function::New(env, Crc32cSync, "crc32c"));
  exports.Set("crc32cAsync", Napi::Function::New(env, Crc32cAsync, "crc32cAsync"));
  exports.Set("copyCrc32cAsync", Napi::Function::New(env, CopyCrc32cAsync, "copyCrc32cAsync"));
  exports.Set("preadCrc32cAsync", Napi::Function::New(env, PreadCrc32cAsync, "preadCrc32cAsync"));
  exports.Set("statFilesAsync", Napi::Function::New(env, StatFilesAsync, "statFilesAsync"));
  exports.Set("readFileCrc32cAsync",
              Napi::Function::New(env, ReadFileCrc32cAsync, "readFileCrc32cAsync"));
  exports.Set("writeFileAtomicAsync",
              Napi::Function::New(env, WriteFileAtomicAsync, "writeFileAtomicAsync"));
  return exports;
}

}  // namespace

NODE_API_MODULE(kvtier_native, Init)
