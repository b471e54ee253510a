/* meshrt/export.h: MESHRT_API marks what libmeshrt.so exports. meshrt is compiled with
 * -fvisibility=hidden, so a declaration without it is internal to the library. Programs linking
 * the static archive (libmeshrt.a) define MESHRT_STATIC (the meshrt::meshrt_static target does). */
#ifndef MESHRT_EXPORT_H
#define MESHRT_EXPORT_H

#if defined(MESHRT_STATIC)
#define MESHRT_API
#elif defined(__GNUC__) || defined(__clang__)
#define MESHRT_API __attribute__((visibility("default")))
#else
#define MESHRT_API
#endif

#endif /* MESHRT_EXPORT_H */
