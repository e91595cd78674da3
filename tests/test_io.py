"""kit.io: the run lock is portable (no fcntl at import) and exclusive across processes."""
import subprocess
import sys
import textwrap
from pathlib import Path

from kit.io import FileLock

REPO = Path(__file__).resolve().parents[1]


def _python(code: str, *args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code), *args], cwd=REPO,
                          capture_output=True, text=True, timeout=timeout)


def test_kit_io_imports_without_fcntl(tmp_path):
    """As on Windows: `import fcntl` fails, kit.io (and the train module that takes the lock)
    still imports and the lock still works."""
    done = _python("""
        import sys
        sys.modules["fcntl"] = None          # every `import fcntl` now raises ImportError
        try:
            import fcntl
        except ImportError:
            pass
        else:
            raise SystemExit("fcntl still importable")
        import kit.io
        with kit.io.FileLock(sys.argv[1]) as got:
            print("got", got)
        """, str(tmp_path / ".lock"))
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["got", "True"]


def test_two_processes_contend_for_one_lock(tmp_path):
    """A second process is refused while the first holds the lock, and gets it once released."""
    lock = tmp_path / "run" / ".lock"
    holder = subprocess.Popen([sys.executable, "-c", textwrap.dedent("""
        import sys
        from kit.io import FileLock
        with FileLock(sys.argv[1]) as got:
            print("held" if got else "refused", flush=True)
            sys.stdin.readline()             # hold until the test says so
        """), str(lock)], cwd=REPO, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        contender = """
            import sys
            from kit.io import FileLock
            with FileLock(sys.argv[1]) as got:
                print(got)
            """
        assert _python(contender, str(lock)).stdout.strip() == "False"
        with FileLock(lock) as got:
            assert not got
        holder.stdin.write("\n")
        holder.stdin.flush()
        assert holder.wait(timeout=60) == 0
        assert _python(contender, str(lock)).stdout.strip() == "True"
    finally:
        holder.kill()


def test_lock_is_released_when_holder_dies(tmp_path):
    """A killed holder leaves no stale lock (the OS drops it with the process)."""
    lock = tmp_path / ".lock"
    holder = subprocess.Popen([sys.executable, "-c", textwrap.dedent("""
        import sys, time
        from kit.io import FileLock
        with FileLock(sys.argv[1]) as got:
            print(got, flush=True)
            time.sleep(600)
        """), str(lock)], cwd=REPO, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "True"
        with FileLock(lock) as got:
            assert not got
    finally:
        holder.kill()
        holder.wait(timeout=60)
    with FileLock(lock) as got:
        assert got
