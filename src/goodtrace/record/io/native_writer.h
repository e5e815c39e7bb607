/* The native writer's GIL-free half: a byte ring of fixed-field records (one producer at a
 * time: every append runs under the GIL), and a pthread that encodes them to JSON lines and
 * appends them to the rank's segment files, one write per flush, a heartbeat every flush
 * interval. Nothing here touches a Python object, so a training thread that keeps the GIL
 * cannot delay a write. _native.c is the Python side (appends, start, flush, close, counters).
 */
#ifndef GOODTRACE_NATIVE_WRITER_H
#define GOODTRACE_NATIVE_WRITER_H

#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

enum { E_PAD = 0, E_SPAN = 1, E_STEP = 2, E_SYNC = 3, E_TAG = 4, E_METRIC = 5, E_BLOB = 6 };
enum { F_STEP = 1, F_SEQ = 2, F_AFTER = 4, F_VFLOAT = 8, F_VINT = 16 };

/* One fixed-field record: a span (id1 key; v: t0, t1, step, thread), a step (v: step, t0, t1,
 * seq), a sync point (id1 how; v: step, t, seq, after), a tag (id1 name; v: step, t) or a
 * metric (id1 name, id2 reduce; v: step, t, int value; d: float value). Flags say which
 * optional fields are present. A blob is a header followed by `len` bytes of encoded lines. */
typedef struct {
    uint32_t size; /* bytes of the whole entry, a multiple of 8 */
    uint16_t type;
    uint16_t flags;
    uint32_t id1;
    uint32_t id2;
    int64_t v[4];
    double d;
} Entry;

typedef struct {
    uint32_t size;
    uint16_t type;
    uint16_t flags;
    uint32_t len;
    uint32_t pad;
} BlobHeader;

/* Interned texts (the JSON form of names, the constant start of a span's line), in pages that
 * never move: the writer reads text[id] without a lock for every id it got from the ring. */
#define TEXT_PAGE 1024
#define TEXT_PAGES 1024
typedef struct {
    char *data;
    uint32_t len;
} Text;

typedef struct NativeWriter {
    /* ring: written by the producer (under the GIL), read by the writer thread */
    char *ring;
    uint64_t capacity;
    _Atomic uint64_t head; /* bytes ever produced */
    _Atomic uint64_t tail; /* bytes ever consumed */
    _Atomic uint64_t produced; /* records ever put in the ring */
    _Atomic uint64_t consumed; /* records ever taken out */
    _Atomic uint64_t discard_until; /* clear(): skip entries before this head */
    _Atomic(char *) final_line; /* the finish record when the ring had no room for it */
    _Atomic uint32_t final_len;
    Text *pages[TEXT_PAGES];
    _Atomic uint32_t texts;

    /* the files */
    char *root;   /* the run directory */
    char *prefix; /* rank-NNNNN/<session> */
    char *header[4]; /* the header line around segment, wall and mono */
    size_t header_len[4];
    int fd;
    dev_t dev;
    ino_t ino;
    int64_t segment;
    uint64_t segment_bytes;
    uint64_t segment_limit;
    int has_header;
    double interval_s;
    uint64_t since_check; /* records written since the last check that the file still exists */
    char *out;
    size_t out_len, out_cap;

    /* counters the Python side reads */
    _Atomic uint64_t dropped_full;  /* refused: the ring was full */
    _Atomic uint64_t dropped_write; /* storage refused them */
    _Atomic uint64_t dropped_encode; /* could not be encoded (Python side) */
    _Atomic uint64_t lost;          /* written into a file that was then deleted */
    _Atomic uint64_t written;
    _Atomic uint64_t write_errors;
    _Atomic uint64_t recreated;     /* times the segment was found deleted and started again */
    _Atomic int last_errno;
    _Atomic uint64_t writes;        /* write() calls made */
    _Atomic uint64_t max_chunk_ns;  /* the longest encode + write of one chunk */

    /* control */
    pthread_mutex_t lock;
    pthread_cond_t wake;  /* to the writer: flush, stop */
    pthread_cond_t done;  /* from the writer: flushed, header written, exited */
    uint64_t flush_requested, flush_done;
    int stop, started, header_done, exited;
    pthread_t thread;
} NativeWriter;

int nw_init(NativeWriter *w, uint64_t capacity);
int nw_start(NativeWriter *w);
/* Waits (no GIL held by the caller) until every record put in before the call was written, up
 * to timeout_s. Returns 1 when it was. */
int nw_flush(NativeWriter *w, double timeout_s);
/* Final flush, fsync, close, stop the thread: 1 when done within timeout_s. */
int nw_close(NativeWriter *w, double timeout_s);
int nw_wait_header(NativeWriter *w, double timeout_s);
/* Room for `size` bytes (a multiple of 8) at the head: a pointer, or NULL when full. */
char *nw_reserve(NativeWriter *w, uint32_t size);
void nw_commit(NativeWriter *w, uint32_t size);
uint64_t nw_pending(NativeWriter *w);
uint64_t nw_dropped(NativeWriter *w);
/* Intern a text the writer may later read by id; returns the id, or -1 when the table is full. */
int64_t nw_add_text(NativeWriter *w, const char *data, size_t len);

#endif
