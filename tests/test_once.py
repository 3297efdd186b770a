from mlxspec.once import SaidOnce


def test_each_key_is_said_once_and_nothing_past_the_limit():
    said = SaidOnce(2)
    assert [said.first(k) for k in ("a", "a", "b", "a", "b")] == [True, False, True, False, False]
    assert not said.first("c") and len(said) == 2  # full: a client sending new keys forever is not logged forever
    assert not said.first("c")
