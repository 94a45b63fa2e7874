{
  'variables': {
    'kvtier_cuda_home%': '<!(node ./detect-cuda.mjs home)',
    'kvtier_cuda_skip%': '<!(node ./detect-cuda.mjs skip)',
    # Machine code for every architecture CUDA 13 builds for (Turing to Blackwell), plus PTX of
    # the newest for later GPUs.
    'kvtier_cuda_gencode%': [
      '-gencode=arch=compute_75,code=sm_75', '-gencode=arch=compute_80,code=sm_80',
      '-gencode=arch=compute_86,code=sm_86', '-gencode=arch=compute_89,code=sm_89',
      '-gencode=arch=compute_90,code=sm_90', '-gencode=arch=compute_100,code=sm_100',
      '-gencode=arch=compute_120,code=[sm_120,compute_120]',
    ],
  },
  'targets': [
    {
      'target_name': 'kvtier_native',
      'sources': [
        'src/addon.cc',
        'src/copy_batch.cc',
        'src/copy_plan.cc',
        'src/crc32c.cc',
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
          # The copy kernel and the host<->device copy paths (cuda_copy.cu) go through nvcc; the
          # rest of the addon is plain C++ against the runtime headers.
          'sources': ['src/cuda_copy.cu'],
          'rules': [
            {
              'rule_name': 'nvcc',
              'extension': 'cu',
              'outputs': ['<(INTERMEDIATE_DIR)/<(RULE_INPUT_ROOT).cu.o'],
              'action': [
                '<(kvtier_cuda_home)/bin/nvcc', '-c', '<(RULE_INPUT_PATH)', '-o', '<@(_outputs)',
                '-std=c++17', '-O3', '-Xcompiler', '-fPIC', '-I<(kvtier_cuda_home)/include',
                '<@(kvtier_cuda_gencode)',
              ],
              'message': 'nvcc <(RULE_INPUT_PATH)',
              'process_outputs_as_sources': 1,
            },
          ],
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
