"""Fail-fast readiness: a crash loop ends the wait within a poll, the ready timeout is wall time for an engine
that stays up, and the wait comes in slices that share one baseline."""
from specdeploy.checks.readiness import CRASHED, READY, TIMEOUT, WAITING, crash_reason, wait

UP = {"ActiveState": "activating", "SubState": "start", "Result": "success", "NRestarts": "0",
      "ExecMainStatus": "0", "ExecMainCode": "0", "InvocationID": "aaa"}


class Clock:
    def __init__(self):
        self.t = 1000.0

    def __call__(self):
        return self.t

    def sleep(self, s):
        self.t += s


def run(states, probe=lambda url: False, until=4600.0, slice_s=30.0, state_file=None, clock=None, tmp=None):
    clock = clock or Clock()
    seq = iter(states)
    last = {}

    def read(unit):
        nonlocal last
        last = dict(next(seq, last))
        return last
    return wait("specdeploy-vllm.service", "http://x/health", until, slice_s, 1.0, state_file or tmp / "s.json",
                read, probe, clock, clock.sleep, lambda unit: [f"{unit}: last line"]), clock


def test_crash_on_load_is_noticed_at_the_first_exit(tmp_path):
    crashed = dict(UP, ActiveState="activating", SubState="auto-restart", Result="exit-code", ExecMainStatus="1",
                   ExecMainCode="1")
    o, clock = run([UP, UP, UP, crashed], tmp=tmp_path)
    assert o.status == CRASHED and "ExecMainStatus=1" in o.detail and "restarting" in o.detail
    assert o.journal == ["specdeploy-vllm.service: last line"]
    assert clock() - 1000 <= 3  # three polls, not the hour of the default ready timeout


def test_restart_between_polls_is_a_crash(tmp_path):
    again = dict(UP, NRestarts="1", InvocationID="bbb", SubState="start")
    o, _ = run([UP, UP, again], tmp=tmp_path)
    assert o.status == CRASHED and "restarted the engine 1 time" in o.detail
    o, _ = run([UP, dict(UP, InvocationID="ccc")], tmp=tmp_path / "b")
    assert o.status == CRASHED and "restarted since the wait began" in o.detail
    assert crash_reason(dict(UP, ActiveState="failed", Result="exit-code"), UP).startswith("the unit failed")
    assert crash_reason(dict(UP, ActiveState="inactive"), UP) == "the unit is inactive (ExecMainStatus=0)"
    assert crash_reason(UP, UP) is None


def test_ready_and_slow_engines(tmp_path):
    calls = []
    o, clock = run([UP] * 100, probe=lambda url: calls.append(url) or len(calls) > 5, tmp=tmp_path)
    assert o.status == READY and calls[0] == "http://x/health"
    # alive but slow: 'waiting' after each slice, 'timeout' at the wall-clock deadline, never a crash
    clock = Clock()
    f = tmp_path / "slow.json"
    statuses = []
    while True:
        o, _ = run([UP] * 1000, until=1100.0, slice_s=30, state_file=f, clock=clock)
        statuses.append(o.status)
        if o.status != WAITING:
            break
    assert statuses == [WAITING] * 3 + [TIMEOUT] and 1100 <= clock() <= 1101
    assert o.elapsed_s >= 100  # counted from the first slice: the baseline file carries the start


def test_later_slices_compare_with_the_first_baseline(tmp_path):
    f = tmp_path / "b.json"
    clock = Clock()
    o, _ = run([UP] * 40, slice_s=10, state_file=f, clock=clock)
    assert o.status == WAITING
    # the engine restarted while Ansible started the next slice: still a crash
    o, _ = run([dict(UP, NRestarts="1", InvocationID="zzz")], slice_s=10, state_file=f, clock=clock)
    assert o.status == CRASHED


def test_a_daemons_health_wait_ends_when_its_main_process_exits():
    """ExecStartPost's wait (systemd keeps running it after the main process died): the daemon's exit ends it
    at the next poll, not at the hour's deadline; a live process keeps it waiting until its health passes."""
    from specdeploy.checks.readiness import pid_gone, wait_url
    clock, polls = Clock(), []
    o = wait_url("http://x/health", 4600.0, 1.0, clock, clock.sleep, probe=lambda url: polls.append(url) and False,
                 main_pid=4242, gone=lambda pid: len(polls) >= 3)
    assert o.status == CRASHED and "4242 exited" in o.detail and clock() - 1000 <= 3
    clock = Clock()
    o = wait_url("http://x/health", 4600.0, 1.0, clock, clock.sleep, probe=lambda url: clock() >= 1010,
                 main_pid=4242, gone=lambda pid: False)
    assert o.status == READY and clock() == 1010
    import os
    import subprocess
    assert not pid_gone(os.getpid())
    p = subprocess.Popen(["true"])
    p.wait()
    assert pid_gone(p.pid)
    z = subprocess.Popen(["true"])  # exited, not yet reaped: a zombie is gone too
    import time
    deadline = time.time() + 10
    while time.time() < deadline and not pid_gone(z.pid):
        time.sleep(0.05)
    assert pid_gone(z.pid)
    z.wait()
