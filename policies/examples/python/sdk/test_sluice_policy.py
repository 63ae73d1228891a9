"""The SDK's settings, run natively: `python3 test_sluice_policy.py` (or python3 -m pytest)."""

import sluice_policy as sp

DEFAULTS = {
    "delay_ms": 1_000,
    "strict": False,
    "site": "any",
    "never_retry": ["oct.qa"],
    "limits": [0],
    "site_weights": {"site-a": 1},
    "anything": {},
}


def refused(config: bytes) -> str:
    try:
        sp.parse_config(config, DEFAULTS)
    except sp.ConfigError as error:
        return str(error)
    raise AssertionError(f"{config!r} was accepted")


def test_lists_and_maps_are_read_as_json_and_checked_against_their_defaults():
    settings = sp.parse_config(
        b'never_retry=["oct.qa", "ct.scan"]\nlimits=[1, 2]\n'
        b'site_weights={"site-a": 3, "site-b": 1}\nanything={"x": [1, "y"]}\n',
        DEFAULTS,
    )
    assert settings["never_retry"] == ["oct.qa", "ct.scan"]
    assert settings["limits"] == [1, 2]
    assert settings["site_weights"] == {"site-a": 3, "site-b": 1}
    assert settings["anything"] == {"x": [1, "y"]}
    assert settings["delay_ms"] == 1_000


def test_comma_lists_and_scalars_still_read_as_before():
    settings = sp.parse_config(b"never_retry=a, b\nlimits=4,5\nstrict=true\nsite=x y", DEFAULTS)
    assert (settings["never_retry"], settings["limits"]) == (["a", "b"], [4, 5])
    assert (settings["strict"], settings["site"]) == (True, "x y")


def test_values_of_the_wrong_shape_are_refused_naming_the_setting():
    assert "site_weights: not JSON" in refused(b"site_weights={site-a: 3}")
    assert "site_weights: expected a JSON object" in refused(b"site_weights=[1]")
    assert "site_weights.site-b" in refused(b'site_weights={"site-b": "heavy"}')
    assert "limits" in refused(b'limits=[1, "two"]')
    assert "limits" in refused(b"limits=[-1]")
    assert "strict" in refused(b"strict=[true]")


if __name__ == "__main__":
    for name, test in list(globals().items()):
        if name.startswith("test_"):
            test()
            print(f"{name} passed")
