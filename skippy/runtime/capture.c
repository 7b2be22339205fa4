/* A non-final stage's llama.cpp eval callback (see skippy/runtime/capture.py).
 * llama.cpp asks it about every graph node; it wants only the node named `name` (the real last
 * layer's output), copies it into `dest` and stops the graph there. */
#include <stdbool.h>
#include <stddef.h>
#include <string.h>

struct ggml_tensor;
extern const char * ggml_get_name(const struct ggml_tensor * t);
extern size_t ggml_nbytes(const struct ggml_tensor * t);
extern void ggml_backend_tensor_get(const struct ggml_tensor * t, void * data, size_t offset, size_t size);

typedef struct {
    char name[64];
    char * dest;
    size_t cap_bytes;
    size_t copied;
    int overflow;
} skippy_capture;

bool skippy_capture_eval(struct ggml_tensor * t, bool ask, void * user) {
    skippy_capture * c = (skippy_capture *) user;
    if (strcmp(ggml_get_name(t), c->name) != 0) {
        return !ask;  /* not wanted; when observing, keep going */
    }
    if (ask) {
        return true;
    }
    size_t n = ggml_nbytes(t);
    if (c->copied + n > c->cap_bytes) {
        c->overflow = 1;
        return false;
    }
    ggml_backend_tensor_get(t, c->dest + c->copied, 0, n);
    c->copied += n;
    return false;  /* stop: the stop block and the vocabulary projection are not needed */
}
