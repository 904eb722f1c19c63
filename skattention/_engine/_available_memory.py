"""The memory the system can still give this process (Linux), for choices between an
algorithm's dense arrays and a sparser one made before any work: a dense array past it fails
only after the work before it (torch's allocator), or the kernel ends the process."""

import os

try:
    import resource
except ImportError:  # not on Windows
    resource = None

# A container's memory limit, cgroup v2 then v1: (mount point, limit file, usage file, the
# reclaimable field of memory.stat, the controllers on this process's line of /proc/self/cgroup)
_CGROUPS = (
    ("/sys/fs/cgroup", "memory.max", "memory.current", "inactive_file", ""),
    ("/sys/fs/cgroup/memory", "memory.limit_in_bytes", "memory.usage_in_bytes",
     "total_inactive_file", "memory"),
)
_SELF_CGROUP = "/proc/self/cgroup"


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
    """The least memory that this process's cgroup or one of its ancestors still allows (a
    limit set above the process's own group binds it too; without a cgroup namespace the
    process's group lies below the mount point), or ``None``."""
    paths = _own_cgroups()
    for mount, limit_name, usage_name, reclaimable, controllers in _CGROUPS:
        lefts = []
        for directory in _up_to(mount, paths.get(controllers)):
            limit = _file_bytes(os.path.join(directory, limit_name))
            usage = _file_bytes(os.path.join(directory, usage_name))
            if limit is None or usage is None:
                continue
            stat = os.path.join(directory, "memory.stat")
            inactive = _field_bytes(stat, f"{reclaimable} ", 1) or 0
            lefts.append(max(0, limit - max(0, usage - inactive)))
        if lefts:
            return min(lefts)
    return None


def _own_cgroups():
    """``{controllers: path}`` of this process's lines of /proc/self/cgroup: ``""`` for cgroup
    v2's, ``"memory"`` for v1's memory controller."""
    paths = {}
    try:
        with open(_SELF_CGROUP) as f:
            for line in f:
                _, controllers, path = line.rstrip("\n").split(":", 2)
                if controllers == "" or "memory" in controllers.split(","):
                    paths["" if controllers == "" else "memory"] = path
    except (OSError, ValueError):
        pass
    return paths


def _up_to(mount, path):
    """``mount/path`` and its parents up to ``mount``, those that exist (inside a container the
    mount point is the container's own group, whatever the path says)."""
    if path is None:
        return []
    parts = [part for part in path.split("/") if part]
    directories = [os.path.join(mount, *parts[:i]) for i in range(len(parts), -1, -1)]
    return [d for d in directories if os.path.isdir(d)]


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
