/*
 * uattn.Layer: one attention layer's immutable description (uattn_layer), its names for the library's
 * enums, and its own copies of the per-head sinks and ALiBi slopes.
 */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "uattn_py.h"

static bool is_fp8(uattn_dtype d) { return d == UATTN_FP8_E4M3 || d == UATTN_FP8_E5M2; }

static const char *attn_type_names[] = {"decoder", "encoder", "encoder_only", "encoder_decoder"};
static const char *layout_names[] = {"NHD", "HND", "TILED"}; /* by uattn_kv_layout */

/* Copies a [n] float32/float64 array (or a sequence of numbers) into fresh memory. */
static int copy_head_values(PyObject *obj, const char *name, int32_t n, float **out) {
  if (obj == Py_None) return 0;
  PyObject *conv = PyObject_CallMethod(uattn_py_numpy, "ascontiguousarray", "Os", obj, "float32");
  if (!conv) {
    PyErr_Clear();
    PyErr_Format(PyExc_ValueError, "%s: expected %d numbers (one per query head)", name, (int)n);
    return -1;
  }
  array a;
  int rc = uattn_py_array_get(&a, conv, name, 0);
  Py_ssize_t want = n;
  if (!rc) rc = uattn_py_array_shape(&a, 1, &want);
  if (!rc) {
    *out = PyMem_Malloc((size_t)n * sizeof(float));
    if (!*out) {
      PyErr_NoMemory();
      rc = -1;
    } else {
      memcpy(*out, a.data, (size_t)n * sizeof(float));
    }
  }
  uattn_py_array_release(&a);
  Py_DECREF(conv);
  return rc;
}

static int Layer_init(LayerObject *self, PyObject *args, PyObject *kw) {
  static char *kwlist[] = {"num_q_heads",  "num_kv_heads", "head_dim",     "dtype",          "cache_dtype",
                           "kv_layout",    "scale",        "soft_cap",     "sliding_window", "sinks",
                           "alibi_slopes", "attn_type",    "causal_width", "chunk_size",     "probs_fp32",
                           "k_scale",      "v_scale",      "head_dim_v",   "kv_latent",      NULL};
  int hq, hkv, d, window = 0, causal_width = 0, chunk = 0, probs_fp32 = 0, dv = 0, latent = 0;
  double k_scale = 1.0;
  PyObject *dtype_o = NULL, *cache_o = Py_None, *scale_o = Py_None, *sinks_o = Py_None, *alibi_o = Py_None;
  PyObject *v_scale_o = Py_None;
  const char *layout = "NHD", *attn = "decoder";
  double soft_cap = 0.0;
  if (!PyArg_ParseTupleAndKeywords(args, kw, "iii|OOsOdiOOsiipdOip:Layer", kwlist, &hq, &hkv, &d, &dtype_o, &cache_o,
                                   &layout, &scale_o, &soft_cap, &window, &sinks_o, &alibi_o, &attn, &causal_width,
                                   &chunk, &probs_fp32, &k_scale, &v_scale_o, &dv, &latent))
    return -1;
  /* a latent's values are its keys' bytes, read through one scale (uattn.h): v_scale left out is k_scale's */
  double v_scale = latent ? k_scale : 1.0;
  if (v_scale_o != Py_None && (v_scale = PyFloat_AsDouble(v_scale_o)) == -1.0 && PyErr_Occurred()) return -1;
  /* immutable once made: a forward on another thread may be reading it with the GIL released */
  if (self->layer.num_q_heads) {
    PyErr_SetString(PyExc_RuntimeError, "Layer already initialized (layers are immutable)");
    return -1;
  }
  if (hq <= 0 || hkv <= 0 || d <= 0 || hq % hkv) {
    PyErr_Format(PyExc_ValueError,
                 "num_q_heads, num_kv_heads, head_dim: expected positive counts with num_q_heads a multiple of "
                 "num_kv_heads, got %d, %d, %d",
                 hq, hkv, d);
    return -1;
  }
  uattn_dtype dtype = UATTN_BF16, cache_dtype;
  if (dtype_o && uattn_py_parse_dtype(dtype_o, "dtype", &dtype)) return -1;
  cache_dtype = dtype;
  if (cache_o != Py_None && uattn_py_parse_dtype(cache_o, "cache_dtype", &cache_dtype)) return -1;
  if (is_fp8(dtype)) {
    PyErr_Format(PyExc_ValueError, "dtype: \"%s\" is a cache dtype only (q, k, v and out are f32, bf16 or f16)",
                 uattn_py_dtype_str(dtype));
    return -1;
  }
  /* checked whatever the cache dtype (the library ignores them for other caches): a bad scale is a mistake
   * either way, and a float that rounds to 0 or inf would store infinities */
  const float ks = (float)k_scale, vs = (float)v_scale;
  if (!(isfinite(ks) && ks > 0) || !(isfinite(vs) && vs > 0)) {
    char msg[160];
    snprintf(msg, sizeof msg, "k_scale, v_scale: expected finite numbers > 0 (as float32), got %g, %g", k_scale,
             v_scale);
    PyErr_SetString(PyExc_ValueError, msg);
    return -1;
  }
  if (dv < 0) {
    PyErr_Format(PyExc_ValueError, "head_dim_v: expected >= 0 (0: head_dim), got %d", dv);
    return -1;
  }
  if (latent && (dv < 1 || dv > d)) {
    PyErr_Format(PyExc_ValueError,
                 "head_dim_v: a kv_latent layer needs 0 < head_dim_v <= head_dim (the dims of each latent that are "
                 "its value), got %d with head_dim %d",
                 dv, d);
    return -1;
  }
  if (latent && is_fp8(cache_dtype) && ks != vs) {
    char msg[200];
    snprintf(msg, sizeof msg,
             "v_scale: a kv_latent layer on an fp8 cache reads its values through k_scale; v_scale (%g) must equal "
             "k_scale (%g) or be left out",
             (double)vs, (double)ks);
    PyErr_SetString(PyExc_ValueError, msg);
    return -1;
  }
  uattn_layer L = uattn_layer_default(hq, hkv, d, dtype);
  L.cache_dtype = cache_dtype;
  /* 0 where the values are as wide as the keys: what the layer of a model without latent attention holds */
  L.head_dim_v = latent || (dv && dv != d) ? dv : 0;
  L.kv_latent = latent != 0;
  L.k_scale = ks;
  L.v_scale = vs;
  int l = 0;
  while (l < 3 && strcmp(layout, layout_names[l])) l++;
  if (l == 3) {
    PyErr_Format(PyExc_ValueError, "kv_layout: expected \"NHD\", \"HND\" or \"TILED\", got \"%s\"", layout);
    return -1;
  }
  L.kv_layout = (uattn_kv_layout)l;
  if (latent && L.kv_layout == UATTN_LAYOUT_TILED) {
    PyErr_SetString(
        PyExc_ValueError,
        "kv_latent: needs kv_layout \"NHD\" or \"HND\" (a latent has no value rows to tile), got \"TILED\"");
    return -1;
  }
  int t = -1;
  for (int i = 0; i < 4; i++)
    if (!strcmp(attn, attn_type_names[i])) t = i;
  if (t < 0) {
    PyErr_Format(PyExc_ValueError,
                 "attn_type: expected \"decoder\", \"encoder\", \"encoder_only\" or \"encoder_decoder\", got \"%s\"",
                 attn);
    return -1;
  }
  L.attn_type = (uattn_attention_type)t;
  if (scale_o != Py_None) {
    double s = PyFloat_AsDouble(scale_o);
    if (s == -1.0 && PyErr_Occurred()) return -1;
    L.scale = (float)s;
  }
  if (soft_cap < 0 || window < 0 || causal_width < 0 || chunk < 0) {
    PyErr_SetString(PyExc_ValueError, "soft_cap, sliding_window, causal_width, chunk_size: expected >= 0");
    return -1;
  }
  L.soft_cap = (float)soft_cap;
  L.sliding_window = window;
  L.causal_width = causal_width;
  L.chunk_size = chunk;
  L.probs_fp32 = probs_fp32 != 0;
  if (copy_head_values(sinks_o, "sinks", hq, &self->sinks) ||
      copy_head_values(alibi_o, "alibi_slopes", hq, &self->alibi)) {
    PyMem_Free(self->sinks); /* a failed __init__ leaves the object as new */
    PyMem_Free(self->alibi);
    self->sinks = self->alibi = NULL;
    return -1;
  }
  L.sinks = self->sinks;
  L.alibi_slopes = self->alibi;
  self->layer = L;
  return 0;
}

static void Layer_dealloc(LayerObject *self) {
  PyMem_Free(self->sinks);
  PyMem_Free(self->alibi);
  Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *Layer_get(LayerObject *self, void *which) {
  const uattn_layer *L = &self->layer;
  switch ((intptr_t)which) {
  case 0: return PyLong_FromLong(L->num_q_heads);
  case 1: return PyLong_FromLong(L->num_kv_heads);
  case 2: return PyLong_FromLong(L->head_dim);
  case 3: return PyUnicode_FromString(uattn_py_dtype_str(L->dtype));
  case 4: return PyUnicode_FromString(uattn_py_dtype_str(L->cache_dtype));
  case 5: return PyUnicode_FromString(layout_names[L->kv_layout]);
  case 6: return PyFloat_FromDouble(L->scale);
  case 7: return PyFloat_FromDouble(L->soft_cap);
  case 8: return PyLong_FromLong(L->sliding_window);
  case 9: return self->sinks ? uattn_py_numpy_copy(self->sinks, L->num_q_heads, 4, "float32") : Py_NewRef(Py_None);
  case 10: return self->alibi ? uattn_py_numpy_copy(self->alibi, L->num_q_heads, 4, "float32") : Py_NewRef(Py_None);
  case 11: return PyUnicode_FromString(attn_type_names[L->attn_type]);
  case 12: return PyLong_FromLong(L->causal_width);
  case 13: return PyLong_FromLong(L->chunk_size);
  case 15: return PyFloat_FromDouble(L->k_scale);
  case 16: return PyFloat_FromDouble(L->v_scale);
  case 17: return PyLong_FromLong(L->head_dim_v ? L->head_dim_v : L->head_dim);
  case 18: return PyBool_FromLong(L->kv_latent);
  default: return PyBool_FromLong(L->probs_fp32);
  }
}

#define LAYER_ATTR(name, i)                                                                                            \
  { name, (getter)Layer_get, NULL, NULL, (void *)(intptr_t)(i) }
static PyGetSetDef Layer_getset[] = {LAYER_ATTR("num_q_heads", 0),    LAYER_ATTR("num_kv_heads", 1),
                                     LAYER_ATTR("head_dim", 2),       LAYER_ATTR("dtype", 3),
                                     LAYER_ATTR("cache_dtype", 4),    LAYER_ATTR("kv_layout", 5),
                                     LAYER_ATTR("scale", 6),          LAYER_ATTR("soft_cap", 7),
                                     LAYER_ATTR("sliding_window", 8), LAYER_ATTR("sinks", 9),
                                     LAYER_ATTR("alibi_slopes", 10),  LAYER_ATTR("attn_type", 11),
                                     LAYER_ATTR("causal_width", 12),  LAYER_ATTR("chunk_size", 13),
                                     LAYER_ATTR("probs_fp32", 14),    LAYER_ATTR("k_scale", 15),
                                     LAYER_ATTR("v_scale", 16),       LAYER_ATTR("head_dim_v", 17),
                                     LAYER_ATTR("kv_latent", 18),     {NULL}};

static PyObject *Layer_repr(LayerObject *self) {
  const uattn_layer *L = &self->layer;
  char mla[64] = "";
  if (L->head_dim_v || L->kv_latent)
    snprintf(mla, sizeof mla, ", head_dim_v=%d%s", L->head_dim_v, L->kv_latent ? ", kv_latent=True" : "");
  return PyUnicode_FromFormat(
      "uattn.Layer(%d, %d, %d, dtype=\"%s\", cache_dtype=\"%s\", kv_layout=\"%s\", "
      "attn_type=\"%s\"%s)",
      L->num_q_heads, L->num_kv_heads, L->head_dim, uattn_py_dtype_str(L->dtype), uattn_py_dtype_str(L->cache_dtype),
      layout_names[L->kv_layout], attn_type_names[L->attn_type], mla);
}

PyTypeObject uattn_py_layer_type = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "uattn.Layer",
    .tp_basicsize = sizeof(LayerObject),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc =
        "Layer(num_q_heads, num_kv_heads, head_dim, dtype=\"bf16\", cache_dtype=None, kv_layout=\"NHD\",\n"
        "      scale=None, soft_cap=0.0, sliding_window=0, sinks=None, alibi_slopes=None,\n"
        "      attn_type=\"decoder\", causal_width=0, chunk_size=0, probs_fp32=False, k_scale=1.0,\n"
        "      v_scale=None, head_dim_v=0, kv_latent=False)\n\n"
        "One attention layer (uattn_layer); immutable. kv_layout: \"NHD\", \"HND\" or \"TILED\" (the cache "
        "shapes: forward's doc). scale None: 1/sqrt(head_dim); cache_dtype None: dtype; \"fp8_e4m3\" "
        "(\"float8_e4m3fn\") and \"fp8_e5m2\" (\"float8_e5m2\") are cache dtypes only, "
        "their caches uint8 arrays of the codes: the cache holds fp8(k / k_scale) and fp8(v / v_scale) and is "
        "read as fp8 * scale (k_scale, v_scale: finite, > 0; v_scale None: 1, or k_scale for kv_latent). sinks and "
        "alibi_slopes ([num_q_heads]) are copied. probs_fp32: keep P in fp32 where the kernels would round it to "
        "bf16 (bf16 dot-product CPUs). Multi-head latent attention: head_dim_v is the values' width Dv (v, the "
        "value cache's rows and out; 0: head_dim); kv_latent=True is the absorbed form, each key's first "
        "head_dim_v dims being its value, with no v and no value cache (forward takes None for both; NHD or HND, "
        "0 < head_dim_v <= head_dim, v_scale == k_scale).",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Layer_init,
    .tp_dealloc = (destructor)Layer_dealloc,
    .tp_getset = Layer_getset,
    .tp_repr = (reprfunc)Layer_repr,
};
