# Thin N-API addon for lb-agent (see native/src/addon.cc): file descriptors
# and syscalls only. Built from source by `npm ci` (root package.json runs
# `node-gyp rebuild --directory=native`). native/ is not a package: the
# node-addon-api include path is resolved by Node from the repo root's
# node_modules (resolution walks upward from native/).
{
  "targets": [
    {
      "target_name": "lbagent_native",
      "sources": [
        "src/addon.cc",
        "src/errors.cc",
        "src/packet_socket.cc",
        "src/icmp6_socket.cc",
        "src/netlink_socket.cc",
        "src/unix_dgram.cc",
        "src/system.cc",
        "src/listen_socket.cc",
        "src/tcp_probe.cc",
        "src/relay.cc",
        "src/digest.cc",
        "src/bpf.cc",
        "src/bpf_object.cc",
        "src/background.cc"
      ],
      "include_dirs": [
        "<!(node -p \"require('node-addon-api').include_dir\")"
      ],
      "defines": [
        "NAPI_VERSION=8",
        "NAPI_CPP_EXCEPTIONS",
        "NODE_ADDON_API_DISABLE_DEPRECATED"
      ],
      "cflags!": ["-fno-exceptions"],
      "cflags_cc!": ["-fno-exceptions"],
      "cflags_cc": ["-std=c++17", "-Wall", "-Wextra", "-Wno-unused-parameter"],
      # libbpf is opened at run time (src/bpf_object.cc says why).
      "libraries": ["-ldl"],
      "dependencies": ["nat_bpf"]
    },
    {
      # The full-NAT engine (bpf/nat.c), compiled for the BPF target beside
      # the addon: build/Release/nat.bpf.o. Built from source on every
      # install, never committed as a binary.
      "target_name": "nat_bpf",
      "type": "none",
      "actions": [
        {
          "action_name": "clang_bpf_nat",
          "inputs": ["bpf/nat.c", "bpf/nat.h"],
          "outputs": ["<(PRODUCT_DIR)/nat.bpf.o"],
          "action": [
            "clang", "-target", "bpf", "-O2", "-g", "-Wall", "-Werror",
            "-I/usr/include/<!(g++ -dumpmachine)",
            "-c", "bpf/nat.c", "-o", "<(PRODUCT_DIR)/nat.bpf.o"
          ]
        }
      ]
    }
  ]
}
