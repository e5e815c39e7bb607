/* The native writer's thread: ring -> JSON lines -> segment files, without the GIL.
 *
 * Every flush interval it takes the records present at that moment, encodes them, appends a
 * heartbeat and writes the lot with one write() per chunk of CHUNK_RECORDS (a chunk as soon as
 * one is waiting, between heartbeats). The bytes are the ones the Python encoder writes
 * (encoding.py): the readers cannot tell the two writers apart. A write that fails part-way is
 * truncated back; a segment whose file was deleted (fstat: no link left, checked at every
 * heartbeat) is counted as lost since the last check and started again, header first, in a
 * recreated directory. Records that storage refused are counted and reported in the next
 * heartbeat; nothing here ever blocks the producer.
 */
#include "native_writer.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/vfs.h>
#include <time.h>
#include <unistd.h>

#define CHUNK_RECORDS 32768
#define POLL_NS 20000000LL

static int64_t now_ns(clockid_t clock)
{
    struct timespec ts;
    clock_gettime(clock, &ts);
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static uint64_t round8(uint64_t n)
{
    return (n + 7) & ~(uint64_t)7;
}

/* A store into a shared file mapping that the filesystem cannot back is a SIGBUS in the
 * training thread, not an error code: the ring goes into a file only on filesystems where
 * reserved blocks stay reserved and pages are served from the page cache (a FUSE filesystem
 * killed the process at the first store in a test here). Not btrfs or ZFS: copy-on-write needs
 * new blocks for every overwrite, so a full disk would be a SIGBUS despite the reservation. */
static int mapping_is_safe(int fd)
{
    struct statfs st;
    if (fstatfs(fd, &st) != 0) {
        return 0;
    }
    switch ((unsigned long)st.f_type) {
    case 0xEF53UL:     /* ext2/3/4 */
    case 0x58465342UL: /* xfs */
    case 0x01021994UL: /* tmpfs */
    case 0x6969UL:     /* nfs */
    case 0x794C7630UL: /* overlayfs (a container's root: the pages are the upper filesystem's) */
        return 1;
    default:
        return 0;
    }
}

static int write_zeros(int fd, uint64_t len)
{
    static const char zeros[1 << 16];
    uint64_t done = 0;
    while (done < len) {
        size_t n = len - done < sizeof(zeros) ? (size_t)(len - done) : sizeof(zeros);
        ssize_t wrote = pwrite(fd, zeros, n, (off_t)done);
        if (wrote < 0 && errno == EINTR) {
            continue;
        }
        if (wrote <= 0) {
            if (wrote == 0) {
                errno = EIO;
            }
            return -1;
        }
        done += (uint64_t)wrote;
    }
    return 0;
}

/* Make, size, reserve (no SIGBUS on a full disk later), lock and map the ring file, and touch
 * every page (no page fault on the training thread's first pass). 0, or -1 with errno set. */
static int map_ring_file(NativeWriter *w, const char *path, uint64_t capacity, uint64_t text_capacity,
                         char *const header[4], const size_t header_len[4])
{
    uint64_t header_bytes = 0, len;
    struct flock lock;
    RingShared *s;
    char *map, *cursor;
    int fd, i, err;
    for (i = 0; i < 4; i++) {
        header_bytes += header_len[i];
    }
    text_capacity = round8(text_capacity + header_bytes);
    len = RING_HEADER_BYTES + text_capacity + capacity;
    fd = open(path, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0644); /* never another process's ring */
    if (fd < 0) {
        return -1;
    }
    if (!mapping_is_safe(fd)) {
        errno = EOPNOTSUPP;
        goto failed;
    }
    memset(&lock, 0, sizeof(lock));
    lock.l_type = F_WRLCK; /* held while this process lives: a reader never recovers a live ring */
    lock.l_whence = SEEK_SET;
    if (fcntl(fd, F_SETLK, &lock) != 0 || ftruncate(fd, (off_t)len) != 0) {
        goto failed;
    }
    if ((err = posix_fallocate(fd, 0, (off_t)len)) != 0) {
        /* a filesystem without fallocate (some FUSE ones): write the zeros, which reserves the
         * blocks as well; no room is no room */
        if (err == ENOSPC || err == EFBIG || write_zeros(fd, len) != 0) {
            errno = err == ENOSPC || err == EFBIG ? err : errno;
            goto failed;
        }
    }
    map = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (map == MAP_FAILED) {
        goto failed;
    }
    memset(map, 0, len); /* fault every page in now */
    s = (RingShared *)map;
    s->version = RING_VERSION;
    s->header_bytes = RING_HEADER_BYTES;
    s->capacity = capacity;
    s->text_offset = RING_HEADER_BYTES;
    s->text_capacity = text_capacity;
    s->ring_offset = RING_HEADER_BYTES + text_capacity;
    s->pid = (int64_t)getpid();
    gethostname(s->host, sizeof(s->host) - 1);
    s->wall = now_ns(CLOCK_REALTIME);
    s->mono = now_ns(CLOCK_MONOTONIC);
    cursor = map + RING_HEADER_BYTES;
    for (i = 0; i < 4; i++) {
        s->header_len[i] = (uint32_t)header_len[i];
        memcpy(cursor, header[i], header_len[i]);
        cursor += header_len[i];
    }
    atomic_store(&s->text_used, round8(header_bytes));
    atomic_thread_fence(memory_order_seq_cst);
    memcpy(s->magic, RING_MAGIC, 8); /* last: a file without it is not a ring yet */
    w->map = map;
    w->map_len = len;
    w->map_fd = fd;
    w->shared = s;
    w->ring = map + s->ring_offset;
    w->text_area = map + RING_HEADER_BYTES;
    return 0;
failed:
    err = errno;
    close(fd);
    unlink(path);
    errno = err;
    return -1;
}

int nw_init(NativeWriter *w, uint64_t capacity, const char *map_path, uint64_t text_capacity,
            char *const header[4], const size_t header_len[4])
{
    int fallback = 0, err = 0;
    memset(w, 0, sizeof(*w));
    w->capacity = capacity;
    w->fd = -1;
    w->map_fd = -1;
    if (map_path != NULL) {
        if (map_ring_file(w, map_path, capacity, text_capacity, header, header_len) == 0) {
            w->map_path = strdup(map_path);
        } else {
            err = errno;
            fallback = 1;
        }
    }
    if (w->map == NULL) {
        w->ring = malloc(capacity);
        w->shared = calloc(1, sizeof(RingShared));
        if (w->ring == NULL || w->shared == NULL) {
            free(w->ring);
            free(w->shared);
            w->ring = NULL;
            w->shared = NULL;
            return -1;
        }
    }
    pthread_mutex_init(&w->lock, NULL);
    pthread_cond_init(&w->wake, NULL);
    pthread_cond_init(&w->done, NULL);
    errno = err;
    return fallback;
}

void nw_release(NativeWriter *w, int remove_file)
{
    if (w->map != NULL) {
        if (remove_file && w->map_path != NULL) {
            unlink(w->map_path); /* before the unlock: a reader never sees it unlocked and whole */
        }
        munmap(w->map, w->map_len);
        close(w->map_fd);
        w->map = NULL;
    } else {
        free(w->ring);
        free(w->shared);
    }
    w->ring = NULL;
    w->shared = NULL;
    free(w->map_path);
    w->map_path = NULL;
}

int64_t nw_add_text(NativeWriter *w, const char *data, size_t len)
{
    uint32_t id = atomic_load_explicit(&w->texts, memory_order_relaxed);
    uint32_t page = id / TEXT_PAGE;
    char *copy;
    if (page >= TEXT_PAGES || len > 0xFFFFFFFFu) {
        return -1;
    }
    if (w->pages[page] == NULL) {
        w->pages[page] = calloc(TEXT_PAGE, sizeof(Text));
        if (w->pages[page] == NULL) {
            return -1;
        }
    }
    if (w->text_area != NULL) { /* in the file, where a reader finds it: [length][bytes] */
        uint64_t used = atomic_load_explicit(&w->shared->text_used, memory_order_relaxed);
        uint64_t need = round8(4 + (uint64_t)len);
        uint32_t length = (uint32_t)len;
        if (used + need > w->shared->text_capacity) {
            return -1; /* full: the record goes through the Python encoder, as bytes in the ring */
        }
        memcpy(w->text_area + used, &length, 4);
        memcpy(w->text_area + used + 4, data, len);
        copy = w->text_area + used + 4;
        atomic_store_explicit(&w->shared->text_used, used + need, memory_order_release);
        atomic_store_explicit(&w->shared->texts, (uint64_t)id + 1, memory_order_release);
    } else {
        copy = malloc(len ? len : 1);
        if (copy == NULL) {
            return -1;
        }
        memcpy(copy, data, len);
    }
    w->pages[page][id % TEXT_PAGE].data = copy;
    w->pages[page][id % TEXT_PAGE].len = (uint32_t)len;
    atomic_store_explicit(&w->texts, id + 1, memory_order_release);
    return id;
}

/* ------------------------------------------------------------------ ring, producer side */
char *nw_reserve(NativeWriter *w, uint32_t size)
{
    uint64_t head = atomic_load_explicit(&w->shared->head, memory_order_relaxed);
    uint64_t tail = atomic_load_explicit(&w->shared->tail, memory_order_acquire);
    uint64_t pos = head % w->capacity;
    uint64_t room = w->capacity - pos; /* contiguous bytes up to the end */
    if (room < size) { /* pad to the end and start again at 0 */
        if (head + room + size - tail > w->capacity) {
            return NULL;
        }
        ((Entry *)(w->ring + pos))->size = (uint32_t)room;
        ((Entry *)(w->ring + pos))->type = E_PAD;
        atomic_store_explicit(&w->shared->head, head + room, memory_order_release);
        return w->ring;
    }
    if (head + size - tail > w->capacity) {
        return NULL;
    }
    return w->ring + pos;
}

void nw_commit(NativeWriter *w, uint32_t size)
{
    uint64_t head = atomic_load_explicit(&w->shared->head, memory_order_relaxed);
    atomic_store_explicit(&w->produced, atomic_load_explicit(&w->produced, memory_order_relaxed) + 1,
                          memory_order_relaxed);
    atomic_store_explicit(&w->shared->head, head + size, memory_order_release); /* the entry is whole */
}

uint64_t nw_pending(NativeWriter *w)
{
    return atomic_load(&w->produced) - atomic_load(&w->consumed);
}

uint64_t nw_dropped(NativeWriter *w)
{
    return atomic_load(&w->dropped_full) + atomic_load(&w->dropped_write) + atomic_load(&w->dropped_encode) +
           atomic_load(&w->lost);
}

/* ------------------------------------------------------------------ encoding */
static int reserve_out(NativeWriter *w, size_t more)
{
    if (w->out_len + more <= w->out_cap) {
        return 0;
    }
    size_t cap = w->out_cap ? w->out_cap : 1 << 20;
    while (cap < w->out_len + more) {
        cap *= 2;
    }
    char *grown = realloc(w->out, cap);
    if (grown == NULL) {
        return -1;
    }
    w->out = grown;
    w->out_cap = cap;
    return 0;
}

static void put(NativeWriter *w, const char *data, size_t len)
{
    memcpy(w->out + w->out_len, data, len);
    w->out_len += len;
}

static void put_text(NativeWriter *w, uint32_t id)
{
    Text *t = &w->pages[id / TEXT_PAGE][id % TEXT_PAGE];
    put(w, t->data, t->len);
}

/* Decimal digits by hand: sprintf costs several times more, and a span has five integers. */
static void put_uint(NativeWriter *w, uint64_t v)
{
    char digits[24];
    int n = 0;
    do {
        digits[n++] = (char)('0' + v % 10);
        v /= 10;
    } while (v);
    while (n) {
        w->out[w->out_len++] = digits[--n];
    }
}

static void put_int(NativeWriter *w, int64_t v)
{
    if (v < 0) {
        w->out[w->out_len++] = '-';
        put_uint(w, (uint64_t)0 - (uint64_t)v);
    } else {
        put_uint(w, (uint64_t)v);
    }
}

static void put_step(NativeWriter *w, const Entry *e, int64_t step)
{
    if (e->flags & F_STEP) {
        put_int(w, step);
    } else {
        put(w, "null", 4);
    }
}

/* A float as Python's repr() writes it (what json.dumps writes): the shortest digits that read
 * back to the same double, in fixed notation when the decimal point falls within -4 < p <= 16,
 * else d.ddde+XX; NaN and infinities are null (json.dumps refuses them; the encoder writes null). */
static void put_double(NativeWriter *w, double x)
{
    char buf[40], digits[24];
    int p, n = 0, exponent, decpt, i;
    char *cursor;
    if (!isfinite(x)) {
        put(w, "null", 4);
        return;
    }
    for (p = 1; p <= 17; p++) {
        snprintf(buf, sizeof(buf), "%.*e", p - 1, x);
        if (strtod(buf, NULL) == x) {
            break;
        }
    }
    cursor = buf;
    if (*cursor == '-') {
        put(w, "-", 1);
        cursor++;
    }
    for (; *cursor && *cursor != 'e'; cursor++) {
        if (*cursor >= '0' && *cursor <= '9') {
            digits[n++] = *cursor;
        }
    }
    exponent = atoi(cursor + 1);
    decpt = exponent + 1;
    if (decpt > -4 && decpt <= 16) {
        if (decpt <= 0) {
            put(w, "0.", 2);
            for (i = 0; i < -decpt; i++) {
                put(w, "0", 1);
            }
            put(w, digits, (size_t)n);
        } else if (decpt >= n) {
            put(w, digits, (size_t)n);
            for (i = n; i < decpt; i++) {
                put(w, "0", 1);
            }
            put(w, ".0", 2);
        } else {
            put(w, digits, (size_t)decpt);
            put(w, ".", 1);
            put(w, digits + decpt, (size_t)(n - decpt));
        }
    } else {
        put(w, digits, 1);
        if (n > 1) {
            put(w, ".", 1);
            put(w, digits + 1, (size_t)(n - 1));
        }
        w->out_len += (size_t)sprintf(w->out + w->out_len, "e%c%02d", exponent < 0 ? '-' : '+', abs(exponent));
    }
}

#define LIT(w, s) put((w), (s), sizeof(s) - 1)

static void encode(NativeWriter *w, const Entry *e)
{
    switch (e->type) {
    case E_SPAN:
        put_text(w, e->id1);
        put_int(w, e->v[0]);
        LIT(w, ",\"t1\":");
        put_int(w, e->v[1]);
        LIT(w, ",\"step\":");
        put_step(w, e, e->v[2]);
        LIT(w, ",\"tid\":");
        put_uint(w, (uint64_t)e->v[3]);
        LIT(w, ",\"err\":false,\"attrs\":null}\n");
        break;
    case E_STEP:
        LIT(w, "{\"kind\":\"step\",\"step\":");
        put_step(w, e, e->v[0]);
        LIT(w, ",\"t0\":");
        put_int(w, e->v[1]);
        LIT(w, ",\"t1\":");
        put_int(w, e->v[2]);
        if (e->flags & F_SEQ) {
            LIT(w, ",\"seq\":");
            put_int(w, e->v[3]);
        }
        LIT(w, "}\n");
        break;
    case E_SYNC:
        LIT(w, "{\"kind\":\"sync\",\"step\":");
        put_step(w, e, e->v[0]);
        LIT(w, ",\"t\":");
        put_int(w, e->v[1]);
        LIT(w, ",\"how\":");
        put_text(w, e->id1);
        if (e->flags & F_SEQ) {
            LIT(w, ",\"seq\":");
            put_int(w, e->v[2]);
        }
        if (e->flags & F_AFTER) {
            LIT(w, ",\"after\":");
            put_int(w, e->v[3]);
        }
        LIT(w, "}\n");
        break;
    case E_TAG:
        LIT(w, "{\"kind\":\"tag\",\"step\":");
        put_step(w, e, e->v[0]);
        LIT(w, ",\"name\":");
        put_text(w, e->id1);
        LIT(w, ",\"t\":");
        put_int(w, e->v[1]);
        LIT(w, "}\n");
        break;
    case E_METRIC:
        LIT(w, "{\"kind\":\"metric\",\"name\":");
        put_text(w, e->id1);
        LIT(w, ",\"step\":");
        put_step(w, e, e->v[0]);
        LIT(w, ",\"value\":");
        if (e->flags & F_VFLOAT) {
            put_double(w, e->d);
        } else if (e->flags & F_VINT) {
            put_int(w, e->v[2]);
        } else {
            put(w, "null", 4);
        }
        LIT(w, ",\"reduce\":");
        put_text(w, e->id2);
        LIT(w, ",\"t\":");
        put_int(w, e->v[1]);
        LIT(w, "}\n");
        break;
    }
}

/* the most bytes one encoded entry can take, beside its interned texts */
static size_t bound(const NativeWriter *w, const Entry *e)
{
    size_t n = 400;
    if (e->type == E_SPAN || e->type == E_SYNC || e->type == E_TAG || e->type == E_METRIC) {
        n += w->pages[e->id1 / TEXT_PAGE][e->id1 % TEXT_PAGE].len;
    }
    if (e->type == E_METRIC) {
        n += w->pages[e->id2 / TEXT_PAGE][e->id2 % TEXT_PAGE].len;
    }
    return n;
}

/* ------------------------------------------------------------------ files */
static void segment_path(NativeWriter *w, char *path, size_t size)
{
    snprintf(path, size, "%s/%s.%05lld.jsonl", w->root, w->prefix, (long long)w->segment);
}

static int make_parents(char *path)
{
    char *slash;
    for (slash = strchr(path + 1, '/'); slash != NULL; slash = strchr(slash + 1, '/')) {
        *slash = '\0';
        if (mkdir(path, 0777) != 0 && errno != EEXIST) {
            *slash = '/';
            return -1;
        }
        *slash = '/';
    }
    return 0;
}

static int open_segment(NativeWriter *w)
{
    char path[4096];
    struct stat st;
    int flags = O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC;
    segment_path(w, path, sizeof(path));
    w->fd = open(path, flags, 0644);
    if (w->fd < 0 && errno == ENOENT && make_parents(path) == 0) {
        w->fd = open(path, flags, 0644);
    }
    if (w->fd < 0) {
        return -1;
    }
    if (fstat(w->fd, &st) == 0) {
        w->dev = st.st_dev;
        w->ino = st.st_ino;
    }
    return 0;
}

static void close_segment(NativeWriter *w, int sync)
{
    if (w->fd >= 0) {
        if (sync) {
            fsync(w->fd); /* once per segment: at rotation and at close */
        }
        close(w->fd);
        w->fd = -1;
    }
}

static void next_segment(NativeWriter *w)
{
    close_segment(w, 0);
    w->segment++;
    w->segment_bytes = 0;
    w->has_header = 0;
}

/* Is the open segment still the file at its path? If not, what went into it since the last
 * check is lost; go on in a new segment (a recreated directory, header first). */
static void check_segment(NativeWriter *w, int thorough)
{
    struct stat st;
    int gone = 0;
    if (w->fd < 0) {
        return;
    }
    if (fstat(w->fd, &st) != 0 || st.st_nlink == 0) {
        gone = 1;
    } else if (thorough) {
        char path[4096];
        segment_path(w, path, sizeof(path));
        gone = stat(path, &st) != 0 || st.st_dev != w->dev || st.st_ino != w->ino;
    }
    if (gone) {
        atomic_fetch_add(&w->lost, w->since_check);
        atomic_fetch_add(&w->recreated, 1);
        next_segment(w);
    }
    w->since_check = 0;
}

static int write_all(NativeWriter *w, const char *data, size_t len)
{
    size_t done = 0;
    while (done < len) {
        ssize_t n = write(w->fd, data + done, len - done);
        if (n < 0 && errno == EINTR) {
            continue;
        }
        if (n <= 0) {
            int err = n < 0 ? errno : EIO;
            if (done) { /* never leave a partial line: cut the file back to where the chunk began */
                struct stat st;
                if (fstat(w->fd, &st) != 0 || ftruncate(w->fd, st.st_size - (off_t)done) != 0) {
                    next_segment(w); /* a torn line stayed: never append after it */
                }
            }
            errno = err;
            return -1;
        }
        done += (size_t)n;
    }
    return 0;
}

/* Write w->out (count records) to the open segment: rotate first if it would grow past the
 * limit, header first in a new segment. On failure the records are dropped and counted. */
static void write_out(NativeWriter *w, uint64_t count, int heartbeat)
{
    char header[1 << 16];
    size_t header_len = 0;
    if (w->segment_bytes && w->segment_bytes + w->out_len > w->segment_limit) {
        check_segment(w, 1);
        if (w->segment_bytes) {
            close_segment(w, 1);
            next_segment(w);
        }
    } else if (heartbeat) {
        check_segment(w, 0);
    }
    if (w->fd < 0 && open_segment(w) != 0) {
        goto failed;
    }
    if (!w->has_header) {
        int64_t parts[3] = {w->segment, now_ns(CLOCK_REALTIME), now_ns(CLOCK_MONOTONIC)};
        int i;
        for (i = 0; i < 4; i++) {
            if (header_len + w->header_len[i] + 24 > sizeof(header)) {
                errno = E2BIG;
                goto failed;
            }
            memcpy(header + header_len, w->header[i], w->header_len[i]);
            header_len += w->header_len[i];
            if (i < 3) {
                header_len += (size_t)sprintf(header + header_len, "%lld", (long long)parts[i]);
            }
        }
        /* the header and the chunk in one write */
        if (reserve_out(w, header_len) != 0) {
            errno = ENOMEM;
            goto failed;
        }
        memmove(w->out + header_len, w->out, w->out_len);
        memcpy(w->out, header, header_len);
        w->out_len += header_len;
    }
    atomic_fetch_add(&w->writes, 1);
    { /* what a reader needs to tell, after a kill, which of these lines reached the file */
        RingShared *s = w->shared;
        atomic_store(&s->j_segment, w->segment);
        atomic_store(&s->segment, w->segment);
        atomic_store(&s->j_offset, w->has_header ? w->segment_bytes : 0);
        atomic_store(&s->j_len, w->out_len);
        atomic_store(&s->j_header, w->has_header ? 0 : 1);
        atomic_store(&s->j_start, w->chunk_start);
        atomic_store(&s->j_end, w->chunk_end);
    }
    if (write_all(w, w->out, w->out_len) != 0) {
        goto failed;
    }
    w->has_header = 1;
    w->segment_bytes += w->out_len;
    w->since_check += count;
    atomic_fetch_add(&w->written, count);
    return;
failed:
    atomic_store(&w->last_errno, errno);
    atomic_fetch_add(&w->write_errors, 1);
    atomic_fetch_add(&w->dropped_write, count);
}

/* Take what is in the ring now, in chunks; the last chunk ends with a heartbeat if asked. */
static void drain(NativeWriter *w, int heartbeat, int whole_chunks_only)
{
    uint64_t head = atomic_load_explicit(&w->shared->head, memory_order_acquire);
    uint64_t tail = atomic_load_explicit(&w->shared->tail, memory_order_relaxed);
    uint64_t discard = atomic_load(&w->shared->discard_until);
    for (;;) {
        uint64_t count = 0, taken = 0;
        int64_t started = now_ns(CLOCK_MONOTONIC), took;
        int last;
        if (whole_chunks_only && atomic_load(&w->produced) - atomic_load(&w->consumed) < CHUNK_RECORDS) {
            return;
        }
        w->out_len = 0;
        w->chunk_start = tail;
        while (tail < head && count < CHUNK_RECORDS) {
            const Entry *e = (const Entry *)(w->ring + tail % w->capacity);
            if (e->type == E_PAD) {
                tail += e->size;
                continue;
            }
            taken++;
            if (tail >= discard) {
                if (e->type == E_BLOB) {
                    const BlobHeader *b = (const BlobHeader *)e;
                    if (reserve_out(w, b->len) == 0) {
                        put(w, (const char *)(b + 1), b->len);
                        count++;
                    } else {
                        atomic_fetch_add(&w->dropped_write, 1);
                    }
                } else if (reserve_out(w, bound(w, e)) == 0) {
                    encode(w, e);
                    count++;
                } else {
                    atomic_fetch_add(&w->dropped_write, 1);
                }
            }
            tail += e->size;
        }
        w->chunk_end = tail;
        last = tail >= head;
        if (last) {
            char *final = atomic_exchange(&w->final_line, NULL);
            if (final != NULL) {
                uint32_t len = atomic_load(&w->final_len);
                if (reserve_out(w, len) == 0) {
                    put(w, final, len);
                    count++;
                } else {
                    atomic_fetch_add(&w->dropped_write, 1);
                }
                free(final);
            }
        }
        if (last && heartbeat) {
            atomic_store(&w->shared->beat_wall, now_ns(CLOCK_REALTIME));
        }
        if (last && heartbeat && reserve_out(w, 160) == 0) {
            w->out_len += (size_t)sprintf(w->out + w->out_len,
                                          "{\"kind\":\"heartbeat\",\"wall\":%lld,\"mono\":%lld,\"dropped\":%llu}\n",
                                          (long long)now_ns(CLOCK_REALTIME), (long long)now_ns(CLOCK_MONOTONIC),
                                          (unsigned long long)nw_dropped(w));
        }
        if (w->out_len || !w->has_header) {
            write_out(w, count, last && heartbeat);
        }
        /* written (or dropped and counted): room again. Not before the write: the ring still
         * holds every record a SIGKILL during the write could cut. */
        atomic_store_explicit(&w->shared->tail, tail, memory_order_release);
        atomic_fetch_add(&w->consumed, taken);
        took = now_ns(CLOCK_MONOTONIC) - started;
        if ((uint64_t)took > atomic_load(&w->max_chunk_ns)) {
            atomic_store(&w->max_chunk_ns, (uint64_t)took);
        }
        if (last) {
            return;
        }
    }
}

static void *writer_main(void *arg)
{
    NativeWriter *w = arg;
    int64_t interval = (int64_t)(w->interval_s * 1e9);
    int64_t next_beat = now_ns(CLOCK_MONOTONIC) + interval;
    sigset_t program_signals; /* the program's, as record/threads.py blocks them in goodtrace's Python threads */
    sigemptyset(&program_signals);
    sigaddset(&program_signals, SIGINT);
    sigaddset(&program_signals, SIGTERM);
    sigaddset(&program_signals, SIGHUP);
    sigaddset(&program_signals, SIGQUIT);
    sigaddset(&program_signals, SIGUSR1);
    sigaddset(&program_signals, SIGUSR2);
    sigaddset(&program_signals, SIGALRM);
    pthread_sigmask(SIG_BLOCK, &program_signals, NULL);
    w->out_len = 0;
    write_out(w, 0, 0); /* the header at once: a process killed in its first second leaves its session */
    pthread_mutex_lock(&w->lock);
    w->header_done = 1;
    pthread_cond_broadcast(&w->done);
    for (;;) {
        int64_t now = now_ns(CLOCK_MONOTONIC);
        uint64_t asked = w->flush_requested;
        int stopping = w->stop;
        if (!stopping && asked == w->flush_done && now < next_beat &&
            nw_pending(w) < CHUNK_RECORDS) {
            int64_t until = next_beat < now + POLL_NS ? next_beat : now + POLL_NS;
            struct timespec ts;
            until += now_ns(CLOCK_REALTIME) - now; /* the condition variable waits on the wall clock */
            ts.tv_sec = until / 1000000000LL;
            ts.tv_nsec = until % 1000000000LL;
            pthread_cond_timedwait(&w->wake, &w->lock, &ts);
            continue;
        }
        pthread_mutex_unlock(&w->lock);
        if (stopping || asked != w->flush_done || now >= next_beat) {
            if (now >= next_beat) {
                next_beat += interval;
                if (next_beat <= now) { /* fell behind (a stopped process): no burst */
                    next_beat = now + interval;
                }
            }
            drain(w, 1, 0);
        } else {
            drain(w, 0, 1);
        }
        if (stopping) {
            close_segment(w, 1);
        }
        pthread_mutex_lock(&w->lock);
        w->flush_done = asked;
        pthread_cond_broadcast(&w->done);
        if (stopping) {
            w->exited = 1;
            pthread_mutex_unlock(&w->lock);
            return NULL;
        }
    }
}

int nw_start(NativeWriter *w)
{
    pthread_attr_t attr;
    int rc;
    pthread_attr_init(&attr);
    rc = pthread_create(&w->thread, &attr, writer_main, w);
    pthread_attr_destroy(&attr);
    if (rc == 0) {
        w->started = 1;
    }
    return rc;
}

static int wait_for(NativeWriter *w, int *flag, uint64_t *seq, uint64_t want, double timeout_s)
{
    struct timespec ts;
    int64_t until = now_ns(CLOCK_REALTIME) + (int64_t)(timeout_s * 1e9);
    int ok;
    ts.tv_sec = until / 1000000000LL;
    ts.tv_nsec = until % 1000000000LL;
    for (;;) {
        ok = flag != NULL ? *flag : *seq >= want;
        if (ok || w->exited || pthread_cond_timedwait(&w->done, &w->lock, &ts) == ETIMEDOUT) {
            ok = flag != NULL ? *flag : *seq >= want;
            return ok;
        }
    }
}

int nw_wait_header(NativeWriter *w, double timeout_s)
{
    int ok;
    pthread_mutex_lock(&w->lock);
    ok = wait_for(w, &w->header_done, NULL, 0, timeout_s);
    pthread_mutex_unlock(&w->lock);
    return ok;
}

int nw_flush(NativeWriter *w, double timeout_s)
{
    int ok;
    uint64_t want;
    pthread_mutex_lock(&w->lock);
    if (w->exited || !w->started) {
        pthread_mutex_unlock(&w->lock);
        return 0;
    }
    want = ++w->flush_requested;
    pthread_cond_signal(&w->wake);
    ok = wait_for(w, NULL, &w->flush_done, want, timeout_s);
    pthread_mutex_unlock(&w->lock);
    return ok;
}

int nw_close(NativeWriter *w, double timeout_s)
{
    int ok;
    pthread_mutex_lock(&w->lock);
    if (!w->started) {
        pthread_mutex_unlock(&w->lock);
        return 0;
    }
    w->stop = 1;
    pthread_cond_signal(&w->wake);
    ok = wait_for(w, &w->exited, NULL, 0, timeout_s);
    pthread_mutex_unlock(&w->lock);
    if (ok) {
        pthread_join(w->thread, NULL);
    } else {
        pthread_detach(w->thread); /* stuck in a hung filesystem: it must not hold the process */
    }
    return ok;
}
