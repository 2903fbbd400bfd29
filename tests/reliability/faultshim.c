/* faultshim: an LD_PRELOAD library that makes chosen libc calls fail, for the reliability tests.
 *
 * Built by tests/reliability/conftest.py (`faultshim` fixture) with the C compiler the test command
 * already needs; loaded only into a subprocess the test starts (tests/reliability/faultrun.py).
 *
 * FAULTSHIM_RULES holds rules separated by ';', each `<call> key=value ...`:
 *   <call>   close fsync fdatasync syncfs flock ftruncate posix_fallocate fallocate
 *            (by descriptor: the path it was opened with) | open unlink rmdir mkdir rename link
 *            (by path; renames and links match either path) | memfd_create (by name)
 *   path=G   fnmatch(3) glob the path (or memfd name) must match; without it every call matches
 *   nth=N    the Nth matching call is the first to fail (1-based); default 1
 *   times=K  how many matching calls fail from there on; default 1 with nth, else every one
 *   errno=E  the error: a name (EIO, ENOSPC, EMFILE, ENOLCK, ...) or a number
 * FAULTSHIM_LOG names a file that gets one line per injected failure: `<call> <errno> <path>`.
 * Rules fire (and count calls) only while armed: from the start when FAULTSHIM_ARMED=1, else once
 * the program calls `faultshim_arm(1)` (ctypes: `ctypes.CDLL(None).faultshim_arm(1)`), so the
 * interpreter's start-up and imports are never counted.
 *
 * Paths are those the program passed (relative ones joined to the directory descriptor's path
 * for the *at calls); a descriptor's path is recorded when open/openat/memfd_create returns it,
 * and becomes the link's path when linkat() gives the unnamed file behind /proc/self/fd/N a name.
 * A failed close() still releases the descriptor, as Linux's close(2) does whatever it returns.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <fnmatch.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#define MAX_RULES 16
#define MAX_FDS 65536

struct rule {
    char call[32];
    char path[1024]; /* empty: any path */
    long nth;        /* 1-based index of the first failing match */
    long times;      /* failures from nth on; -1: unlimited */
    long seen;       /* matching calls so far */
    int err;
};

static struct rule rules[MAX_RULES];
static int n_rules = -1; /* -1: not parsed yet */
static char *fd_paths[MAX_FDS];
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static const char *log_path;
static int armed = -1; /* -1: FAULTSHIM_ARMED decides at the first call */

static const struct {
    const char *name;
    int value;
} ERRNOS[] = {
    {"EIO", EIO},       {"ENOSPC", ENOSPC}, {"EMFILE", EMFILE}, {"ENFILE", ENFILE}, {"ENOLCK", ENOLCK},
    {"EROFS", EROFS},   {"EDQUOT", EDQUOT}, {"ENOMEM", ENOMEM}, {"EPERM", EPERM},   {"EACCES", EACCES},
    {"EBADF", EBADF},   {"EINTR", EINTR},   {"EAGAIN", EAGAIN}, {"EEXIST", EEXIST}, {"ENOENT", ENOENT},
    {"EXDEV", EXDEV},   {"EINVAL", EINVAL}, {"EOPNOTSUPP", EOPNOTSUPP},
};

#define REAL(ret, name, ...)                                                                                 \
    static ret (*real_##name)(__VA_ARGS__);                                                                  \
    if (!real_##name) real_##name = (ret(*)(__VA_ARGS__))dlsym(RTLD_NEXT, #name)

static int parse_errno(const char *text) {
    for (size_t i = 0; i < sizeof ERRNOS / sizeof ERRNOS[0]; i++)
        if (strcmp(ERRNOS[i].name, text) == 0) return ERRNOS[i].value;
    return atoi(text) > 0 ? atoi(text) : EIO;
}

static void parse_rules(void) { /* under lock */
    n_rules = 0;
    log_path = getenv("FAULTSHIM_LOG");
    const char *env = getenv("FAULTSHIM_RULES");
    if (!env) return;
    char *copy = strdup(env), *save_rule = NULL;
    for (char *text = strtok_r(copy, ";", &save_rule); text && n_rules < MAX_RULES;
         text = strtok_r(NULL, ";", &save_rule)) {
        struct rule *r = &rules[n_rules];
        memset(r, 0, sizeof *r);
        r->nth = 1;
        r->times = -1;
        r->err = EIO;
        int have_nth = 0, have_times = 0;
        char *save_field = NULL;
        for (char *field = strtok_r(text, " \t\n", &save_field); field; field = strtok_r(NULL, " \t\n", &save_field)) {
            if (!r->call[0] && !strchr(field, '=')) snprintf(r->call, sizeof r->call, "%s", field);
            else if (strncmp(field, "path=", 5) == 0) snprintf(r->path, sizeof r->path, "%s", field + 5);
            else if (strncmp(field, "nth=", 4) == 0) r->nth = atol(field + 4), have_nth = 1;
            else if (strncmp(field, "times=", 6) == 0) r->times = atol(field + 6), have_times = 1;
            else if (strncmp(field, "errno=", 6) == 0) r->err = parse_errno(field + 6);
        }
        if (have_nth && !have_times) r->times = 1;
        if (r->call[0]) n_rules++;
    }
    free(copy);
}

static void write_log(const char *call, int err, const char *path) { /* under lock */
    if (!log_path) return;
    REAL(int, open, const char *, int, ...);
    REAL(int, close, int);
    int fd = real_open(log_path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0) return;
    char line[2048];
    int n = snprintf(line, sizeof line, "%s %d %s\n", call, err, path ? path : "");
    if (n > (int)sizeof line - 1) n = (int)sizeof line - 1;
    ssize_t ignored = write(fd, line, (size_t)n);
    (void)ignored;
    real_close(fd);
}

/* 0 when the call proceeds, else the errno it fails with (the matching rule's). */
static int should_fail(const char *call, const char *path, const char *path2) {
    int err = 0;
    pthread_mutex_lock(&lock);
    if (n_rules < 0) parse_rules();
    if (armed < 0) armed = getenv("FAULTSHIM_ARMED") && strcmp(getenv("FAULTSHIM_ARMED"), "1") == 0;
    for (int i = 0; i < n_rules && armed && !err; i++) {
        struct rule *r = &rules[i];
        if (strcmp(r->call, call) != 0) continue;
        if (r->path[0]) {
            int hit = (path && fnmatch(r->path, path, 0) == 0) || (path2 && fnmatch(r->path, path2, 0) == 0);
            if (!hit) continue;
        }
        long k = ++r->seen;
        if (k >= r->nth && (r->times < 0 || k < r->nth + r->times)) {
            err = r->err;
            write_log(call, err, path);
        }
    }
    pthread_mutex_unlock(&lock);
    return err;
}

static char *fd_path_copy(int fd) { /* the recorded path of fd (malloc'd) or NULL */
    char *out = NULL;
    if (fd < 0 || fd >= MAX_FDS) return NULL;
    pthread_mutex_lock(&lock);
    if (fd_paths[fd]) out = strdup(fd_paths[fd]);
    pthread_mutex_unlock(&lock);
    return out;
}

static void remember(int fd, const char *path) {
    if (fd < 0 || fd >= MAX_FDS) return;
    pthread_mutex_lock(&lock);
    free(fd_paths[fd]);
    fd_paths[fd] = path ? strdup(path) : NULL;
    pthread_mutex_unlock(&lock);
}

/* `name` as an absolute path when it is relative to a directory descriptor we know (malloc'd). */
static char *at_path(int dirfd, const char *name) {
    if (!name) return NULL;
    if (name[0] == '/' || dirfd == AT_FDCWD) return strdup(name);
    char *dir = fd_path_copy(dirfd), *out = NULL;
    if (!dir) return strdup(name);
    if (asprintf(&out, "%s/%s", dir, name) < 0) out = NULL;
    free(dir);
    return out;
}

static int fail_with(int err) {
    errno = err;
    return -1;
}

static int fd_fails(const char *call, int fd) {
    char *path = fd_path_copy(fd);
    int err = should_fail(call, path ? path : "", NULL);
    free(path);
    return err;
}

static void after_fork_child(void) { pthread_mutex_init(&lock, NULL); }

/* Start (1) or stop (0) injecting; returns how many rules are loaded. */
int faultshim_arm(int on) {
    pthread_mutex_lock(&lock);
    if (n_rules < 0) parse_rules();
    armed = on != 0;
    int n = n_rules;
    pthread_mutex_unlock(&lock);
    return n;
}

__attribute__((constructor)) static void init(void) { pthread_atfork(NULL, NULL, after_fork_child); }

/* -- opening: record the descriptor's path --------------------------------------------------- */

static int needs_mode(int flags) { return (flags & O_CREAT) || (flags & O_TMPFILE) == O_TMPFILE; }

static int do_openat(int dirfd, const char *name, int flags, mode_t mode) {
    REAL(int, openat, int, const char *, int, ...);
    char *path = at_path(dirfd, name);
    int err = should_fail("open", path, NULL);
    int fd = err ? fail_with(err) : real_openat(dirfd, name, flags, mode);
    if (fd >= 0) remember(fd, path);
    free(path);
    return fd;
}

int open(const char *name, int flags, ...) {
    mode_t mode = 0;
    if (needs_mode(flags)) {
        va_list ap;
        va_start(ap, flags);
        mode = va_arg(ap, mode_t);
        va_end(ap);
    }
    return do_openat(AT_FDCWD, name, flags, mode);
}

int open64(const char *name, int flags, ...) {
    mode_t mode = 0;
    if (needs_mode(flags)) {
        va_list ap;
        va_start(ap, flags);
        mode = va_arg(ap, mode_t);
        va_end(ap);
    }
    return do_openat(AT_FDCWD, name, flags, mode);
}

int openat(int dirfd, const char *name, int flags, ...) {
    mode_t mode = 0;
    if (needs_mode(flags)) {
        va_list ap;
        va_start(ap, flags);
        mode = va_arg(ap, mode_t);
        va_end(ap);
    }
    return do_openat(dirfd, name, flags, mode);
}

int openat64(int dirfd, const char *name, int flags, ...) {
    mode_t mode = 0;
    if (needs_mode(flags)) {
        va_list ap;
        va_start(ap, flags);
        mode = va_arg(ap, mode_t);
        va_end(ap);
    }
    return do_openat(dirfd, name, flags, mode);
}

int __open_2(const char *name, int flags) { return do_openat(AT_FDCWD, name, flags, 0); }
int __open64_2(const char *name, int flags) { return do_openat(AT_FDCWD, name, flags, 0); }
int __openat_2(int dirfd, const char *name, int flags) { return do_openat(dirfd, name, flags, 0); }
int __openat64_2(int dirfd, const char *name, int flags) { return do_openat(dirfd, name, flags, 0); }

int memfd_create(const char *name, unsigned int flags) {
    REAL(int, memfd_create, const char *, unsigned int);
    int err = should_fail("memfd_create", name, NULL);
    if (err) return fail_with(err);
    int fd = real_memfd_create(name, flags);
    if (fd >= 0) {
        char path[300];
        snprintf(path, sizeof path, "memfd:%s", name);
        remember(fd, path);
    }
    return fd;
}

/* -- by descriptor --------------------------------------------------------------------------- */

int close(int fd) {
    REAL(int, close, int);
    int err = fd_fails("close", fd);
    remember(fd, NULL);
    int rc = real_close(fd); /* the descriptor is released either way, as on Linux */
    return err ? fail_with(err) : rc;
}

int fsync(int fd) {
    REAL(int, fsync, int);
    int err = fd_fails("fsync", fd);
    return err ? fail_with(err) : real_fsync(fd);
}

int fdatasync(int fd) {
    REAL(int, fdatasync, int);
    int err = fd_fails("fdatasync", fd);
    return err ? fail_with(err) : real_fdatasync(fd);
}

int syncfs(int fd) {
    REAL(int, syncfs, int);
    int err = fd_fails("syncfs", fd);
    return err ? fail_with(err) : real_syncfs(fd);
}

int flock(int fd, int operation) {
    REAL(int, flock, int, int);
    int err = (operation & LOCK_UN) ? 0 : fd_fails("flock", fd);
    return err ? fail_with(err) : real_flock(fd, operation);
}

int ftruncate(int fd, off_t length) {
    REAL(int, ftruncate, int, off_t);
    int err = fd_fails("ftruncate", fd);
    return err ? fail_with(err) : real_ftruncate(fd, length);
}

int posix_fallocate(int fd, off_t offset, off_t len) {
    REAL(int, posix_fallocate, int, off_t, off_t);
    int err = fd_fails("posix_fallocate", fd);
    return err ? err : real_posix_fallocate(fd, offset, len); /* returns the error, errno untouched */
}

int posix_fallocate64(int fd, off_t offset, off_t len) {
    REAL(int, posix_fallocate64, int, off_t, off_t);
    int err = fd_fails("posix_fallocate", fd);
    return err ? err : real_posix_fallocate64(fd, offset, len);
}

int fallocate(int fd, int mode, off_t offset, off_t len) {
    REAL(int, fallocate, int, int, off_t, off_t);
    int err = fd_fails("fallocate", fd);
    return err ? fail_with(err) : real_fallocate(fd, mode, offset, len);
}

/* -- by path --------------------------------------------------------------------------------- */

static int path_fails(const char *call, int dirfd, const char *name, int dirfd2, const char *name2) {
    char *path = at_path(dirfd, name), *path2 = name2 ? at_path(dirfd2, name2) : NULL;
    int err = should_fail(call, path, path2);
    free(path);
    free(path2);
    return err;
}

int unlink(const char *name) {
    REAL(int, unlink, const char *);
    int err = path_fails("unlink", AT_FDCWD, name, AT_FDCWD, NULL);
    return err ? fail_with(err) : real_unlink(name);
}

int unlinkat(int dirfd, const char *name, int flags) {
    REAL(int, unlinkat, int, const char *, int);
    int err = path_fails((flags & AT_REMOVEDIR) ? "rmdir" : "unlink", dirfd, name, AT_FDCWD, NULL);
    return err ? fail_with(err) : real_unlinkat(dirfd, name, flags);
}

int rmdir(const char *name) {
    REAL(int, rmdir, const char *);
    int err = path_fails("rmdir", AT_FDCWD, name, AT_FDCWD, NULL);
    return err ? fail_with(err) : real_rmdir(name);
}

int mkdir(const char *name, mode_t mode) {
    REAL(int, mkdir, const char *, mode_t);
    int err = path_fails("mkdir", AT_FDCWD, name, AT_FDCWD, NULL);
    return err ? fail_with(err) : real_mkdir(name, mode);
}

int mkdirat(int dirfd, const char *name, mode_t mode) {
    REAL(int, mkdirat, int, const char *, mode_t);
    int err = path_fails("mkdir", dirfd, name, AT_FDCWD, NULL);
    return err ? fail_with(err) : real_mkdirat(dirfd, name, mode);
}

int rename(const char *src, const char *dst) {
    REAL(int, rename, const char *, const char *);
    int err = path_fails("rename", AT_FDCWD, src, AT_FDCWD, dst);
    return err ? fail_with(err) : real_rename(src, dst);
}

int renameat(int srcfd, const char *src, int dstfd, const char *dst) {
    REAL(int, renameat, int, const char *, int, const char *);
    int err = path_fails("rename", srcfd, src, dstfd, dst);
    return err ? fail_with(err) : real_renameat(srcfd, src, dstfd, dst);
}

int renameat2(int srcfd, const char *src, int dstfd, const char *dst, unsigned int flags) {
    REAL(int, renameat2, int, const char *, int, const char *, unsigned int);
    int err = path_fails("rename", srcfd, src, dstfd, dst);
    return err ? fail_with(err) : real_renameat2(srcfd, src, dstfd, dst, flags);
}

int link(const char *src, const char *dst) {
    REAL(int, link, const char *, const char *);
    int err = path_fails("link", AT_FDCWD, src, AT_FDCWD, dst);
    return err ? fail_with(err) : real_link(src, dst);
}

int linkat(int srcfd, const char *src, int dstfd, const char *dst, int flags) {
    REAL(int, linkat, int, const char *, int, const char *, int);
    int err = path_fails("link", srcfd, src, dstfd, dst);
    if (err) return fail_with(err);
    int rc = real_linkat(srcfd, src, dstfd, dst, flags);
    char *from = rc == 0 ? at_path(srcfd, src) : NULL;
    if (from && strncmp(from, "/proc/self/fd/", 14) == 0) { /* an unnamed file (O_TMPFILE) linked into place */
        char *to = at_path(dstfd, dst);
        remember(atoi(from + 14), to);
        free(to);
    }
    free(from);
    return rc;
}
