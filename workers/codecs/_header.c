/* The compiled request-header parser of workers/codecs/protocol.py: parse(frame) -> RequestHeader in one C call.
 *
 * Why it exists (measured, issue 57): every request a worker serves starts with its header, and for an idle
 * consumer's long poll the header is a tenth of the Python the worker spends on the whole request. The Python
 * parser (struct for the key and version, kio's reader for header v1, a tagged-field check, a NamedTuple) took
 * 1.9 us per header of a Fetch v12 on a quiet machine (5.2 on a loaded one); this takes 0.23 us (0.9)
 * (`python -m scripts.bench_protocol`, case request_header_v2_fetch_v12, the Python parser on its "kio" side).
 *
 * Contract (tests/test_request_header.py checks it against the Python parser on random and hand-made frames):
 * - Header v1: api_key int16, api_version int16, correlation_id int32, client_id a nullable int16-length UTF-8
 *   string (length -1: None). Header v2, for a flexible version (api_version >= first_flexible[api_key]), adds a
 *   tagged-field section, skipped whole: an unsigned varint count, then per field a varint tag, a varint size
 *   and that many bytes (varints of at most 5 bytes).
 * - Returns the configured RequestHeader class (a NamedTuple) of (api_key, api_version, correlation_id,
 *   client_id, body_offset, flexible). Raises the configured ProtocolError on any malformed or truncated header,
 *   never reads past the frame, and allocates nothing in proportion to a length it has not checked.
 * - configure(request_header_class, protocol_error_class, first_flexible_dict) must be called once before parse.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>

#define MAX_UVARINT_BYTES 5
#define NEVER_FLEXIBLE (1 << 15)

static PyTypeObject *request_header_class;
static PyObject *protocol_error;
static PyObject *first_flexible;

static PyObject *
header_configure(PyObject *module, PyObject *args)
{
    PyObject *cls, *error, *flexible;
    if (!PyArg_ParseTuple(args, "O!OO!", &PyType_Type, &cls, &error, &PyDict_Type, &flexible))
        return NULL;
    if (!PyType_IsSubtype((PyTypeObject *)cls, &PyTuple_Type)) {
        PyErr_SetString(PyExc_TypeError, "configure: the header class must be a tuple type");
        return NULL;
    }
    Py_XSETREF(request_header_class, (PyTypeObject *)Py_NewRef(cls));
    Py_XSETREF(protocol_error, Py_NewRef(error));
    Py_XSETREF(first_flexible, Py_NewRef(flexible));
    Py_RETURN_NONE;
}

static int16_t
read_i16(const unsigned char *p)
{
    return (int16_t)(((uint16_t)p[0] << 8) | p[1]);
}

/* An unsigned varint at *pos (below end): its value; -1 with an exception set if truncated or overlong. */
static int
read_uvarint(const unsigned char *buf, Py_ssize_t *pos, Py_ssize_t end, uint64_t *value)
{
    uint64_t result = 0;
    int shift = 0;
    for (Py_ssize_t at = *pos; at < end && at < *pos + MAX_UVARINT_BYTES; at++) {
        unsigned char byte = buf[at];
        result |= (uint64_t)(byte & 0x7F) << shift;
        if (!(byte & 0x80)) {
            *pos = at + 1;
            *value = result;
            return 0;
        }
        shift += 7;
    }
    PyErr_SetString(protocol_error, "request header malformed: truncated or overlong unsigned varint");
    return -1;
}

static PyObject *
malformed(const char *what)
{
    PyErr_Format(protocol_error, "request header malformed: %s", what);
    return NULL;
}

static PyObject *
parse_buffer(const unsigned char *buf, Py_ssize_t len)
{
    if (len < 4) {
        PyErr_Format(protocol_error, "request header truncated (%zd bytes)", len);
        return NULL;
    }
    if (len < 10)
        return malformed("truncated");
    int api_key = read_i16(buf);
    int api_version = read_i16(buf + 2);
    int32_t correlation_id = (int32_t)(((uint32_t)buf[4] << 24) | ((uint32_t)buf[5] << 16)
                                       | ((uint32_t)buf[6] << 8) | buf[7]);
    int client_id_length = read_i16(buf + 8);
    Py_ssize_t pos = 10;
    PyObject *client_id;
    if (client_id_length == -1) {
        client_id = Py_NewRef(Py_None);
    } else if (client_id_length < 0) {
        return malformed("negative client id length");
    } else if (client_id_length > len - pos) {
        return malformed("client id past the frame");
    } else {
        client_id = PyUnicode_DecodeUTF8((const char *)buf + pos, client_id_length, NULL);
        if (client_id == NULL) {
            PyErr_Clear();
            return malformed("client id not UTF-8");
        }
        pos += client_id_length;
    }
    int flexible = 0;
    if (api_key >= 0) {
        PyObject *key = PyLong_FromLong(api_key);
        PyObject *first = key == NULL ? NULL : PyDict_GetItemWithError(first_flexible, key);
        Py_XDECREF(key);
        if (first == NULL && PyErr_Occurred())
            goto fail;
        long first_version = first == NULL ? NEVER_FLEXIBLE : PyLong_AsLong(first);
        if (first_version == -1 && PyErr_Occurred())
            goto fail;
        flexible = api_version >= first_version;
    }
    if (flexible) {
        if (pos < len && buf[pos] == 0) {
            pos += 1;  /* an empty section: every request pays this */
        } else {
            uint64_t count, tag, size;
            if (read_uvarint(buf, &pos, len, &count) < 0)
                goto fail;
            if (count > (uint64_t)(len - pos)) {
                PyErr_SetString(protocol_error, "tagged field count exceeds the bytes left");
                goto fail;
            }
            for (uint64_t i = 0; i < count; i++) {
                if (read_uvarint(buf, &pos, len, &tag) < 0 || read_uvarint(buf, &pos, len, &size) < 0)
                    goto fail;
                if (size > (uint64_t)(len - pos)) {
                    PyErr_SetString(protocol_error, "truncated tagged field");
                    goto fail;
                }
                pos += (Py_ssize_t)size;
            }
        }
    }
    PyObject *items[6] = {PyLong_FromLong(api_key), PyLong_FromLong(api_version), PyLong_FromLong(correlation_id),
                          client_id, PyLong_FromSsize_t(pos), PyBool_FromLong(flexible)};
    PyObject *header = request_header_class->tp_alloc(request_header_class, 6);
    for (int i = 0; i < 6; i++) {
        if (header != NULL && items[i] != NULL)
            PyTuple_SET_ITEM(header, i, items[i]);  /* steals the reference, client_id's included */
        else
            Py_XDECREF(items[i]);
    }
    if (header != NULL && (items[0] == NULL || items[1] == NULL || items[2] == NULL || items[4] == NULL)) {
        Py_DECREF(header);  /* its NULL items are skipped by tuple dealloc */
        return NULL;
    }
    return header;
fail:
    Py_DECREF(client_id);
    return NULL;
}

/* parse(frame) -> RequestHeader; frame: any contiguous buffer (bytes, a memoryview of a request frame). */
static PyObject *
header_parse(PyObject *module, PyObject *frame)
{
    if (request_header_class == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "parse before configure");
        return NULL;
    }
    Py_buffer view;
    if (PyObject_GetBuffer(frame, &view, PyBUF_SIMPLE) < 0)
        return NULL;
    PyObject *result = parse_buffer((const unsigned char *)view.buf, view.len);
    PyBuffer_Release(&view);
    return result;
}

static PyMethodDef header_methods[] = {
    {"configure", header_configure, METH_VARARGS,
     "configure(request_header_class, protocol_error_class, first_flexible): what parse returns and raises"},
    {"parse", header_parse, METH_O, "parse(frame) -> RequestHeader of the request header at the frame's start"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef header_module = {
    PyModuleDef_HEAD_INIT, "shmbroker.workers.codecs._header",
    "Compiled request-header parser of workers.codecs.protocol.", -1, header_methods,
};

PyMODINIT_FUNC
PyInit__header(void)
{
    return PyModule_Create(&header_module);
}
