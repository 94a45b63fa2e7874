{
  'variables': {
    'kvtier_cuda_home%': '<!(node ./detect-cuda.mjs home)',
    'kvtier_cuda_skip%': '<!(node ./detect-cuda.mjs skip)',
  },
  'targets': [
    {
      'target_name': 'kvtier_native',
      'sources': [
        'src/addon.cc',
        'src/copy_batch.cc',
        'src/copy_plan.cc',
        'src/crc32c.cc',
        'src/crc_lane.cc',
        'src/cuda_device.cc',
        'src/errors.cc',
        'src/file_io.cc',
        'src/host_memory.cc',
        'src/prefault.cc',
      ],
      'dependencies': ["<!(node -p \"require('node-addon-api').targets\"):node_addon_api_except"],
      'defines': ['NAPI_VERSION=8', 'NODE_ADDON_API_DISABLE_DEPRECATED', 'KVTIER_CUDA_SKIP=<(kvtier_cuda_skip)'],
      'cflags_cc': ['-std=c++17', '-O3', '-Wall', '-Wextra'],
      'cflags_cc!': ['-std=gnu++17'],
      'libraries': ['-lpthread'],
      'conditions': [
        ['kvtier_cuda_home!=""', {
          'defines': ['KVTIER_WITH_CUDA=1'],
          'include_dirs': ['<(kvtier_cuda_home)/include'],
          # Static cudart: the addon loads with no driver installed; libcuda is opened at run
          # time by the runtime itself, and the probe reports its absence.
          'libraries': [
            '<(kvtier_cuda_home)/lib64/libcudart_static.a',
            '-ldl',
            '-lrt',
          ],
        }],
      ],
    },
  ],
}
