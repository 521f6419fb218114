/*
 * krex.h: region markers for C and C++ benchmarks run under KREX.
 *
 *     if (krex_region_begin) krex_region_begin();   // the GPU is ours alone from here...
 *     time_the_kernel();
 *     if (krex_region_end) krex_region_end();       // ...to here
 *
 * libkrex.so (preloaded by `krex run`) defines both. They are declared weak, so a program
 * builds without linking libkrex.so and runs without it (the addresses are then NULL: test
 * them as above). Both return 0 on success and -1 on failure (one warning line on stderr);
 * outside krex they do nothing and return 0. Regions nest within a thread: only the outermost
 * pair talks to the daemon. A failed begin still wants its end (which then returns -1 quietly).
 */
#ifndef KREX_H
#define KREX_H

#ifdef __cplusplus
extern "C" {
#endif

#if defined(__GNUC__) || defined(__clang__)
#define KREX_WEAK_ __attribute__((weak))
#else
#define KREX_WEAK_
#endif

KREX_WEAK_ int krex_region_begin(void);
KREX_WEAK_ int krex_region_end(void);

#undef KREX_WEAK_

#ifdef __cplusplus
}
#endif

#endif /* KREX_H */
