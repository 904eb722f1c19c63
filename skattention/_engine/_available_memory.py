"""The memory the system can still give this process (Linux), for choices between an
algorithm's dense arrays and a sparser one made before any work: a dense array past it fails
only after the work before it (torch's allocator), or the kernel ends the process."""

try:
    import resource
except ImportError:  # not on Windows
    resource = None

# (limit, usage, statistics, reclaimable field) of a container's memory limit: cgroup v2, v1
_CGROUP_FILES = (
    ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current",
     "/sys/fs/cgroup/memory.stat", "inactive_file"),
    ("/sys/fs/cgroup/memory/memory.limit_in_bytes", "/sys/fs/cgroup/memory/memory.usage_in_bytes",
     "/sys/fs/cgroup/memory/memory.stat", "total_inactive_file"),
)


def available_memory():
    """Bytes of memory the system can still give this process, or ``None`` where it cannot be
    read: Linux's ``MemAvailable``, within what a container's memory limit leaves (cgroup v2
    ``memory.max`` or v1 ``memory.limit_in_bytes``, less the group's usage but its inactive
    page cache, which the kernel reclaims first; ``/proc/meminfo`` shows the host's memory
    inside a container) and what an address-space limit (``ulimit -v``) leaves above
    ``VmSize``."""
    available = _field_bytes("/proc/meminfo", "MemAvailable:", 1024)
    for left in (_cgroup_left(), _address_space_left()):
        if left is not None:
            available = left if available is None else min(available, left)
    return available


def _cgroup_left():
    for limit_path, usage_path, stat_path, reclaimable in _CGROUP_FILES:
        limit, usage = _file_bytes(limit_path), _file_bytes(usage_path)
        if limit is None or usage is None:
            continue
        inactive = _field_bytes(stat_path, f"{reclaimable} ", 1) or 0
        return max(0, limit - max(0, usage - inactive))
    return None


def _address_space_left():
    limit = resource.getrlimit(resource.RLIMIT_AS)[0] if resource is not None else None
    used = _field_bytes("/proc/self/status", "VmSize:", 1024)
    if limit is None or limit == resource.RLIM_INFINITY or used is None:
        return None
    return max(0, limit - used)


def _file_bytes(path):
    """The number a file holds (``None``: unreadable, or ``max``, no limit)."""
    try:
        with open(path) as f:
            return int(f.read().strip())
    except (OSError, ValueError):
        return None


def _field_bytes(path, field, unit):
    """``unit`` times the number after ``field`` at the start of a line of ``path``, or
    ``None`` where it cannot be read."""
    try:
        with open(path) as f:
            for line in f:
                if line.startswith(field):
                    return int(line.split()[1]) * unit
    except (OSError, ValueError, IndexError):
        pass
    return None
