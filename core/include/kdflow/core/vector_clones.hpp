// Function multiversioning for kdflow's own vectorized loops: with GCC a function marked
// KD_VECTOR_CLONES is built for AVX-512 (x86-64-v4) and AVX2 with FMA (x86-64-v3) beside the
// baseline, and the loader picks the widest this CPU has when the library is loaded. Not under the
// sanitizers (the clones' resolver runs before their runtimes are up: a TSan build crashed at
// start) nor with Clang (the fuzz build): there the baseline alone.
#pragma once

#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) &&                             \
    !defined(__SANITIZE_THREAD__) && !defined(__SANITIZE_ADDRESS__)
#define KD_VECTOR_CLONES                                                                           \
  __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define KD_VECTOR_CLONES
#endif
