//! The part of librados' and librbd's C API the store uses (Debian's librados-dev and
//! librbd-dev; Ceph 16). Declarations only: the safe wrapper is [`crate::Image`].
#![allow(non_camel_case_types)]

use std::os::raw::{c_char, c_int, c_void};

pub type rados_t = *mut c_void;
pub type rados_ioctx_t = *mut c_void;
pub type rbd_image_t = *mut c_void;
pub type rbd_completion_t = *mut c_void;
/// Called by librbd (on one of its threads, or on the submitting one) once per completion
/// when the request is over: the completion and the argument given at its creation.
pub type rbd_callback_t = extern "C" fn(rbd_completion_t, *mut c_void);
/// Called by `rbd_diff_iterate2` per extent: offset, length, whether it exists.
pub type rbd_diff_cb = extern "C" fn(u64, usize, c_int, *mut c_void) -> c_int;
/// Called by librbd (on its own thread) when the image's header changed: a resize, a
/// snapshot, a feature or lock change.
pub type rbd_update_callback_t = extern "C" fn(*mut c_void);
/// Called by librados when a notify reaches a watch: arg, notify id, watch cookie,
/// notifier's client id, payload.
pub type rados_watchcb2_t = extern "C" fn(*mut c_void, u64, u64, u64, *mut c_void, usize);
/// Called by librados when a watch fails: arg, cookie, error.
pub type rados_watcherrcb_t = extern "C" fn(*mut c_void, u64, c_int);

#[link(name = "rados")]
extern "C" {
    pub fn rados_create(cluster: *mut rados_t, id: *const c_char) -> c_int;
    pub fn rados_conf_read_file(cluster: rados_t, path: *const c_char) -> c_int;
    pub fn rados_conf_set(cluster: rados_t, option: *const c_char, value: *const c_char) -> c_int;
    /// The option's value as text into `buf`; -ENAMETOOLONG if it does not fit.
    pub fn rados_conf_get(
        cluster: rados_t,
        option: *const c_char,
        buf: *mut c_char,
        len: usize,
    ) -> c_int;
    pub fn rados_connect(cluster: rados_t) -> c_int;
    pub fn rados_shutdown(cluster: rados_t);
    pub fn rados_ioctx_create(
        cluster: rados_t,
        pool_name: *const c_char,
        ioctx: *mut rados_ioctx_t,
    ) -> c_int;
    pub fn rados_ioctx_destroy(io: rados_ioctx_t);
    pub fn rados_ioctx_set_namespace(io: rados_ioctx_t, nspace: *const c_char);
    pub fn rados_write_full(
        io: rados_ioctx_t,
        oid: *const c_char,
        buf: *const c_char,
        len: usize,
    ) -> c_int;
    pub fn rados_watch2(
        io: rados_ioctx_t,
        oid: *const c_char,
        cookie: *mut u64,
        watchcb: rados_watchcb2_t,
        watcherrcb: rados_watcherrcb_t,
        arg: *mut c_void,
    ) -> c_int;
    pub fn rados_unwatch2(io: rados_ioctx_t, cookie: u64) -> c_int;
    /// Waits until no watch callback runs any more.
    pub fn rados_watch_flush(cluster: rados_t) -> c_int;
    pub fn rados_notify2(
        io: rados_ioctx_t,
        oid: *const c_char,
        buf: *const c_char,
        buf_len: c_int,
        timeout_ms: u64,
        reply_buffer: *mut *mut c_char,
        reply_buffer_len: *mut usize,
    ) -> c_int;
    pub fn rados_notify_ack(
        io: rados_ioctx_t,
        oid: *const c_char,
        notify_id: u64,
        cookie: u64,
        buf: *const c_char,
        buf_len: c_int,
    ) -> c_int;
    pub fn rados_buffer_free(buf: *mut c_char);
}

#[link(name = "rbd")]
extern "C" {
    pub fn rbd_open(
        io: rados_ioctx_t,
        name: *const c_char,
        image: *mut rbd_image_t,
        snap_name: *const c_char,
    ) -> c_int;
    pub fn rbd_open_read_only(
        io: rados_ioctx_t,
        name: *const c_char,
        image: *mut rbd_image_t,
        snap_name: *const c_char,
    ) -> c_int;
    pub fn rbd_close(image: rbd_image_t) -> c_int;
    pub fn rbd_get_size(image: rbd_image_t, size: *mut u64) -> c_int;
    pub fn rbd_update_watch(
        image: rbd_image_t,
        handle: *mut u64,
        watch_cb: rbd_update_callback_t,
        arg: *mut c_void,
    ) -> c_int;
    /// Returns once no callback of the watch runs or will run.
    pub fn rbd_update_unwatch(image: rbd_image_t, handle: u64) -> c_int;
    pub fn rbd_read2(
        image: rbd_image_t,
        ofs: u64,
        len: usize,
        buf: *mut c_char,
        op_flags: c_int,
    ) -> isize;
    pub fn rbd_write2(
        image: rbd_image_t,
        ofs: u64,
        len: usize,
        buf: *const c_char,
        op_flags: c_int,
    ) -> isize;
    pub fn rbd_flush(image: rbd_image_t) -> c_int;
    pub fn rbd_aio_create_completion(
        cb_arg: *mut c_void,
        complete_cb: rbd_callback_t,
        c: *mut rbd_completion_t,
    ) -> c_int;
    /// 0 once queued (the callback will run); negative: not queued, no callback.
    pub fn rbd_aio_read2(
        image: rbd_image_t,
        off: u64,
        len: usize,
        buf: *mut c_char,
        c: rbd_completion_t,
        op_flags: c_int,
    ) -> c_int;
    /// 0 once queued (the callback will run); negative: not queued, no callback. `buf`
    /// must stay valid until the completion's callback.
    pub fn rbd_aio_write2(
        image: rbd_image_t,
        off: u64,
        len: usize,
        buf: *const c_char,
        c: rbd_completion_t,
        op_flags: c_int,
    ) -> c_int;
    /// Completes once every write queued before it is durable. 0 once queued.
    pub fn rbd_aio_flush(image: rbd_image_t, c: rbd_completion_t) -> c_int;
    /// The bytes read, or a negative errno.
    pub fn rbd_aio_get_return_value(c: rbd_completion_t) -> isize;
    /// Frees the completion (allowed in its callback).
    pub fn rbd_aio_release(c: rbd_completion_t);
    pub fn rbd_write_zeroes(
        image: rbd_image_t,
        ofs: u64,
        len: usize,
        zero_flags: c_int,
        op_flags: c_int,
    ) -> isize;
    pub fn rbd_diff_iterate2(
        image: rbd_image_t,
        fromsnapname: *const c_char,
        ofs: u64,
        len: u64,
        include_parent: u8,
        whole_object: u8,
        cb: rbd_diff_cb,
        arg: *mut c_void,
    ) -> c_int;
}

// The C++ shim (shim/read_bl.cc, compiled by build.rs): reads into a `ceph::bufferlist`.
extern "C" {
    /// A new empty bufferlist, or null.
    pub fn rsv_bl_new() -> *mut c_void;
    pub fn rsv_bl_free(bl: *mut c_void);
    /// As `rbd_aio_read2`, into `bl` (empty), which belongs to librbd from a successful
    /// call (0) until the completion's callback.
    pub fn rsv_rbd_aio_read_bl(
        image: rbd_image_t,
        off: u64,
        len: usize,
        bl: *mut c_void,
        c: rbd_completion_t,
        op_flags: c_int,
    ) -> c_int;
    pub fn rsv_bl_length(bl: *const c_void) -> usize;
    /// The number of non-empty segments of `bl`; the first `max` go to `ptrs` and `lens`.
    pub fn rsv_bl_segments(
        bl: *const c_void,
        ptrs: *mut *const c_char,
        lens: *mut usize,
        max: usize,
    ) -> usize;
}

// Compare-and-write (the `caw` module).
#[link(name = "rbd")]
extern "C" {
    /// Compares `[ofs, ofs + len)` with `cmp_buf` and writes `buf` there if equal, in one
    /// OSD operation. `len` on success; -EILSEQ on a mismatch, its offset in
    /// `mismatch_off`; -EINVAL for a range librbd does not take (16.2: any range that
    /// leaves one 512-byte sector).
    pub fn rbd_compare_and_write(
        image: rbd_image_t,
        ofs: u64,
        len: usize,
        cmp_buf: *const c_char,
        buf: *const c_char,
        mismatch_off: *mut u64,
        op_flags: c_int,
    ) -> isize;
}

/// A compound write operation (`rados_create_write_op`): its actions apply atomically.
pub type rados_write_op_t = *mut c_void;

/// `rados_write_op_create`: fail with EEXIST if the object exists.
pub const LIBRADOS_CREATE_EXCLUSIVE: c_int = 1;
/// `rados_write_op_cmpxattr`: the xattr must equal the value.
pub const LIBRADOS_CMPXATTR_OP_EQ: u8 = 1;

// Persistent reservations kept in the cluster (`pr.rs`): a small object read whole and
// replaced whole under a compare-and-set guard, and the health of a watch.
#[link(name = "rados")]
extern "C" {
    pub fn rados_read(
        io: rados_ioctx_t,
        oid: *const c_char,
        buf: *mut c_char,
        len: usize,
        off: u64,
    ) -> c_int;
    /// Milliseconds since the watch was last confirmed, or a negative errno if broken.
    pub fn rados_watch_check(io: rados_ioctx_t, cookie: u64) -> c_int;
    pub fn rados_create_write_op() -> rados_write_op_t;
    pub fn rados_release_write_op(op: rados_write_op_t);
    pub fn rados_write_op_create(op: rados_write_op_t, exclusive: c_int, category: *const c_char);
    pub fn rados_write_op_cmpxattr(
        op: rados_write_op_t,
        name: *const c_char,
        comparison_operator: u8,
        value: *const c_char,
        value_len: usize,
    );
    pub fn rados_write_op_setxattr(
        op: rados_write_op_t,
        name: *const c_char,
        value: *const c_char,
        value_len: usize,
    );
    pub fn rados_write_op_write_full(op: rados_write_op_t, buffer: *const c_char, len: usize);
    pub fn rados_write_op_operate(
        op: rados_write_op_t,
        io: rados_ioctx_t,
        oid: *const c_char,
        mtime: *mut libc::time_t,
        flags: c_int,
    ) -> c_int;
}

// Extended attributes of a RADOS object: the ALUA records of a gateway group (`alua`).
pub type rados_xattrs_iter_t = *mut c_void;

extern "C" {
    pub fn rados_setxattr(
        io: rados_ioctx_t,
        oid: *const c_char,
        name: *const c_char,
        buf: *const c_char,
        len: usize,
    ) -> c_int;
    pub fn rados_getxattrs(
        io: rados_ioctx_t,
        oid: *const c_char,
        iter: *mut rados_xattrs_iter_t,
    ) -> c_int;
    /// The next attribute; `*name` is null after the last.
    pub fn rados_getxattrs_next(
        iter: rados_xattrs_iter_t,
        name: *mut *const c_char,
        val: *mut *const c_char,
        len: *mut usize,
    ) -> c_int;
    pub fn rados_getxattrs_end(iter: rados_xattrs_iter_t);
}
