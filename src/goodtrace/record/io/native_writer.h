/* The native writer's GIL-free half: a byte ring of fixed-field records (one producer at a
 * time: every append runs under the GIL), and a pthread that encodes them to JSON lines and
 * appends them to the rank's segment files, one write per flush, a heartbeat every flush
 * interval. Nothing here touches a Python object, so a training thread that keeps the GIL
 * cannot delay a write. _native.c is the Python side (appends, start, flush, close, counters).
 *
 * The ring, its offsets and the interned texts live in a file mapped MAP_SHARED beside the
 * session's segments (<segment prefix>.ring, RingShared at its start) when it could be made:
 * a record whose append returned is in the kernel's page cache, so a SIGKILL loses nothing
 * that reached the ring; goodtrace.read.ring decodes it. Otherwise the same layout lives in
 * the process's own memory.
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

/* The start of a ring file (RING_HEADER_BYTES, then the interned texts' area, then the ring);
 * goodtrace/read/ring.py reads it field by field: change both together, and RING_VERSION.
 * All offsets are bytes; the ring's are "ever produced" counters (position = offset % capacity). */
#define RING_MAGIC "GTRING\0\0"
#define RING_VERSION 1
#define RING_HEADER_BYTES 4096
typedef struct {
    char magic[8];
    uint32_t version;
    uint32_t header_bytes;
    uint64_t capacity;      /* the ring's bytes */
    uint64_t ring_offset;   /* where the ring starts in the file */
    uint64_t text_offset;   /* the texts' area: the segment header's 4 parts, then each text */
    uint64_t text_capacity; /* as [uint32 length][bytes], padded to 8 */
    uint32_t header_len[4]; /* the segment header's parts (around segment, wall and mono) */
    int64_t pid;
    int64_t wall, mono;     /* when the ring was made (a recovered segment's header) */
    _Atomic uint64_t head;  /* bytes ever produced: every entry before it is complete */
    _Atomic uint64_t tail;  /* bytes ever consumed: every entry before it was written (or dropped) */
    _Atomic uint64_t discard_until; /* clear(): entries before this are never written */
    _Atomic uint64_t text_used;     /* bytes of the texts' area in use */
    _Atomic uint64_t texts;         /* texts interned */
    _Atomic int64_t segment;        /* the segment the writer writes to */
    /* the write in flight: ring entries [j_start, j_end) as j_len bytes appended at j_offset of
     * segment j_segment (its header first when j_header); in flight while tail == j_start < j_end */
    _Atomic int64_t j_segment;
    _Atomic uint64_t j_offset, j_len, j_header, j_start, j_end;
    /* signs of life for a reader on another host, where a lock on NFS mounted without a lock
     * service says nothing: the wall clock at the writer's last heartbeat, its interval, its host */
    _Atomic int64_t beat_wall;
    int64_t interval_ns;
    char host[64];
} RingShared;

typedef struct NativeWriter {
    /* ring: written by the producer (under the GIL), read by the writer thread */
    char *ring;
    uint64_t capacity;
    RingShared *shared; /* head, tail, texts, the write in flight: in the file, or calloc'd */
    char *map;          /* the mapped file (NULL: the ring is in this process's memory) */
    char *map_path;
    size_t map_len;
    int map_fd;
    char *text_area;
    _Atomic uint64_t produced; /* records ever put in the ring */
    _Atomic uint64_t consumed; /* records ever taken out */
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
    uint64_t chunk_start, chunk_end; /* the ring entries whose lines w->out holds */

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

/* The ring in this process's memory (map_path NULL) or in a file mapped MAP_SHARED there:
 * 0 when it is in the file, 1 when it fell back to memory (errno says why), -1 out of memory. */
int nw_init(NativeWriter *w, uint64_t capacity, const char *map_path, uint64_t text_capacity,
            char *const header[4], const size_t header_len[4]);
/* After a clean close: unmap and delete the ring file. */
void nw_release(NativeWriter *w, int remove_file);
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
