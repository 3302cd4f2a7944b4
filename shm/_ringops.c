/* Compiled fast path of shm/ring.py: one frame published in one C call.
 *
 * Why it exists (measured, see RingWriter.write): a paced producer wakes with cold caches, and the
 * pure-Python write (about fifteen bytecode lines, a lock-based fence, the doorbell call) took
 * 2.7 us p50 from stamp to doorbell. That made the ring's one-way p99 at 100 B worse than a raw
 * os.pipe, which moves and wakes in one syscall. This function does the same steps in C.
 *
 * Invariants (the same as shm/ring.py's, which documents the layout):
 * - Publication order: frame header and payload are stored first, then head with a release
 *   store; a full (seq_cst) fence orders that store before the load of the consumer's sleeping
 *   flag. That is the producer half of the announce-then-recheck handshake, on any
 *   architecture (a `dmb ish` on arm64, `mfence` on x86-64).
 * - Only the fast case is handled here: the frame fits before the end of the data area, within
 *   the free space seen at `tail_seen`, and is no larger than `max_payload`. Anything else
 *   returns -1 and the caller takes the Python path (wrap, skip marker, tail refresh, errors).
 * - The caller owns the mapping: `header` must be the address of a live ring mapping
 *   (`address()` of its buffer) for the whole call.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <errno.h>
#include <stdint.h>
#include <string.h>
#include <unistd.h>

/* Layout constants; shm/ring.py checks at import that they equal its own. */
#define HEADER_BYTES 4096
#define FRAME_HEADER_BYTES 8
#define HEAD_WORD 16
#define SLEEPING_WORD 48

static PyObject *
ringops_address(PyObject *module, PyObject *obj)
{
    Py_buffer view;
    if (PyObject_GetBuffer(obj, &view, PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS) < 0)
        return NULL;
    PyObject *result = PyLong_FromVoidPtr(view.buf);
    PyBuffer_Release(&view);
    return result;
}

/* publish_frame(header, capacity, pos, tail_seen, max_payload, payload, eventfd) -> int
 *
 * Returns -1 if the frame needs the Python path. Otherwise the new head, times two, plus 1 if the
 * consumer sleeps and still has to be woken: when `eventfd` >= 0 this function has already written
 * it and the low bit is 0; with -1 (another kind of doorbell) the caller rings. */
static PyObject *
ringops_publish_frame(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 7) {
        PyErr_SetString(PyExc_TypeError, "publish_frame takes 7 arguments");
        return NULL;
    }
    char *header = (char *)PyLong_AsVoidPtr(args[0]);
    unsigned long long capacity = PyLong_AsUnsignedLongLong(args[1]);
    unsigned long long pos = PyLong_AsUnsignedLongLong(args[2]);
    unsigned long long tail_seen = PyLong_AsUnsignedLongLong(args[3]);
    long long max_payload = PyLong_AsLongLong(args[4]);
    int eventfd = _PyLong_AsInt(args[6]);
    if (PyErr_Occurred())
        return NULL;
    if (header == NULL || capacity == 0 || (capacity & (capacity - 1))) {
        PyErr_SetString(PyExc_ValueError, "publish_frame: not a ring mapping");
        return NULL;
    }
    Py_buffer payload;
    if (PyObject_GetBuffer(args[5], &payload, PyBUF_C_CONTIGUOUS) < 0)
        return NULL;
    unsigned long long size = (unsigned long long)payload.len;
    unsigned long long off = pos & (capacity - 1);
    unsigned long long end = off + FRAME_HEADER_BYTES + ((size + 7) & ~7ULL);
    if ((long long)size > max_payload || end > capacity || pos + (end - off) - tail_seen > capacity) {
        PyBuffer_Release(&payload);
        return PyLong_FromLong(-1);
    }
    char *data = header + HEADER_BYTES;
    uint64_t *head_word = (uint64_t *)header + HEAD_WORD;
    uint64_t *sleeping_word = (uint64_t *)header + SLEEPING_WORD;
    *(uint64_t *)(data + off) = size;  /* u32 length, u32 reserved = 0 (little-endian) */
    memcpy(data + off + FRAME_HEADER_BYTES, payload.buf, size);
    PyBuffer_Release(&payload);
    unsigned long long head = pos + (end - off);
    __atomic_store_n(head_word, head, __ATOMIC_RELEASE);
    __atomic_thread_fence(__ATOMIC_SEQ_CST);
    int wake = __atomic_load_n(sleeping_word, __ATOMIC_RELAXED) != 0;
    if (wake && eventfd >= 0) {
        uint64_t one = 1;
        /* EAGAIN: the counter is at its maximum, so the fd is readable already. */
        if (write(eventfd, &one, sizeof one) < 0 && errno != EAGAIN)
            return PyErr_SetFromErrno(PyExc_OSError);
        wake = 0;
    }
    return PyLong_FromUnsignedLongLong(head * 2 + (unsigned long long)wake);
}

static PyMethodDef ringops_methods[] = {
    {"address", ringops_address, METH_O, "Address of a writable contiguous buffer (the caller keeps it alive)."},
    {"publish_frame", (PyCFunction)(void (*)(void))ringops_publish_frame, METH_FASTCALL,
     "Publish one frame if it fits before the end; see the module comment."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef ringops_module = {
    PyModuleDef_HEAD_INIT, "shm._ringops", "Compiled fast path of shm.ring (one frame per call).", -1, ringops_methods,
};

PyMODINIT_FUNC
PyInit__ringops(void)
{
    PyObject *module = PyModule_Create(&ringops_module);
    if (module == NULL)
        return NULL;
    if (PyModule_AddIntConstant(module, "HEADER_BYTES", HEADER_BYTES) < 0 ||
        PyModule_AddIntConstant(module, "FRAME_HEADER_BYTES", FRAME_HEADER_BYTES) < 0 ||
        PyModule_AddIntConstant(module, "HEAD_WORD", HEAD_WORD) < 0 ||
        PyModule_AddIntConstant(module, "SLEEPING_WORD", SLEEPING_WORD) < 0) {
        Py_DECREF(module);
        return NULL;
    }
    return module;
}
