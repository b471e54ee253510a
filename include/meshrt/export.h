/* meshrt/export.h: MESHRT_API gives a declaration default visibility (meshrt is compiled with
 * -fvisibility=hidden). It does not by itself export it: libmeshrt.so exports the C API of
 * meshrt.h and nothing else an application can use (the C++ API is header-only over it).
 * Programs linking the static archive (libmeshrt.a) define MESHRT_STATIC (the
 * meshrt::meshrt_static target does). */
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
