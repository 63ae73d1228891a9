"""The policy's rules, run natively: `python3 -m pytest` (the bindings are not needed)."""

import sys
import types

# app.py imports the bindings componentize-py generates; a unit test needs only their names.
sys.modules.setdefault("wit_world", types.SimpleNamespace(exports=types.SimpleNamespace(
    Priority=object, Fairness=object, NamedPriority=object)))

import sluice_policy as sp  # noqa: E402
from app import Priority  # noqa: E402


def bucket_of(policy, kind, labels=None):
    task = sp.Task.of(seq=1, bucket=sp.LOW, kind=kind, labels=labels)
    return policy.admit_task(0, task)[0]


def test_listed_kinds_and_emergencies_are_urgent_and_the_rest_keep_their_bucket():
    policy = Priority.configured(b"urgent_prefixes=oct.")
    assert bucket_of(policy, "oct.qa") == sp.URGENT
    assert bucket_of(policy, "ct.scan") == sp.LOW
    assert bucket_of(policy, "ct.scan", {"ed": "true"}) == sp.URGENT


def test_a_setting_it_does_not_know_is_refused():
    try:
        Priority.configured(b"urgent_prefix=oct.")
    except sp.ConfigError as error:
        assert "urgent_prefix" in str(error)
    else:
        raise AssertionError("an unknown setting was accepted")


if __name__ == "__main__":  # without pytest: python3 test_app.py
    for name, test in list(globals().items()):
        if name.startswith("test_"):
            test()
            print(f"{name} passed")
