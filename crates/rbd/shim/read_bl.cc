// Reads through librbd's C++ API into a ceph::bufferlist, for the rbd store (see
// crates/rbd/src/aio.rs). librbd's C API reads into the caller's buffer, which costs a copy
// of every byte out of the buffers the messenger received into; a read into a bufferlist
// hands those buffers over instead. The store sends them to the initiator as they are and
// frees the list once sent.
//
// librbd::Image is the C++ face of the same handle as the C API's rbd_image_t: its only
// member is the image context that rbd_image_t points to (librbd.hpp: `image_ctx_t ctx`,
// private), and RBD::AioCompletion is what rbd_completion_t points to. The read borrows
// the store's open C handle through an Image laid over it, never constructed nor
// destroyed (its destructor would close the image).

#include <cstring>
#include <new>

#include <rados/buffer.h>
#include <rbd/librbd.h>
#include <rbd/librbd.hpp>

static_assert(sizeof(librbd::Image) == sizeof(rbd_image_t),
              "librbd::Image is expected to hold the image context and nothing else");

extern "C" {

// A new empty bufferlist, or null when out of memory.
void *rsv_bl_new(void) { return new (std::nothrow) ceph::bufferlist(); }

void rsv_bl_free(void *bl) { delete static_cast<ceph::bufferlist *>(bl); }

// Queues a read of `len` bytes at `off` into `bl` (empty), completed through `c` as
// rbd_aio_read2 would. 0 once queued: `bl` then belongs to librbd until the completion's
// callback. Negative: not queued, no callback.
int rsv_rbd_aio_read_bl(rbd_image_t image, uint64_t off, size_t len, void *bl,
                        rbd_completion_t c, int op_flags) {
  alignas(librbd::Image) unsigned char face[sizeof(librbd::Image)];
  std::memcpy(face, &image, sizeof(image));
  auto *img = reinterpret_cast<librbd::Image *>(face);
  try {
    return img->aio_read2(off, len, *static_cast<ceph::bufferlist *>(bl),
                          reinterpret_cast<librbd::RBD::AioCompletion *>(c), op_flags);
  } catch (const std::bad_alloc &) {
    return -12; // ENOMEM
  } catch (...) {
    return -5; // EIO
  }
}

size_t rsv_bl_length(const void *bl) {
  return static_cast<const ceph::bufferlist *>(bl)->length();
}

// How many non-empty segments `bl` has; the first `max` of them go to `ptrs` and `lens`.
size_t rsv_bl_segments(const void *bl, const char **ptrs, size_t *lens, size_t max) {
  size_t n = 0;
  for (const auto &p : static_cast<const ceph::bufferlist *>(bl)->buffers()) {
    if (p.length() == 0) {
      continue;
    }
    if (n < max) {
      ptrs[n] = p.c_str();
      lens[n] = p.length();
    }
    n++;
  }
  return n;
}

} // extern "C"
