"""The seal on shared values and the credential scope of store keys, as pure functions."""

from __future__ import annotations

from pathlib import Path

import pytest

from proxy.recovery.credential import CredentialScopes, credential_scope, scope_keys
from proxy.replicas.signing import Signer, read_key

NEW, OLD = b"n" * 32, b"o" * 32


def test_a_sealed_value_opens_only_where_it_was_sealed() -> None:
    forged: list[int] = []
    signer = Signer([NEW], lambda: forged.append(1))
    sealed = signer.seal("tailfloor:c:s\x00chain", b'[3,100,1.0,"summary"]')
    assert sealed != b'[3,100,1.0,"summary"]'
    assert signer.unseal("tailfloor:c:s\x00chain", sealed) == b'[3,100,1.0,"summary"]'
    assert forged == []
    # moved to another session or field, altered, or written without the key: absent
    assert signer.unseal("tailfloor:c:t\x00chain", sealed) is None
    assert signer.unseal("tailfloor:c:s\x00chain", sealed[:-2] + b'x"') is None
    assert signer.unseal("tailfloor:c:s\x00chain", b'[3,100,1.0,"planted"]') is None
    assert signer.unseal("tailfloor:c:s\x00chain", Signer([OLD]).seal(
        "tailfloor:c:s\x00chain", b"v")) is None
    assert len(forged) == 4
    assert signer.unseal("tailfloor:c:s\x00chain", None) is None and len(forged) == 4


def test_a_rotated_key_keeps_old_values_readable() -> None:
    before = Signer([OLD]).seal("tailfloor:windows\x00f", b"8192")
    during = Signer([NEW, OLD])
    assert during.unseal("tailfloor:windows\x00f", before) == b"8192"
    after = during.seal("tailfloor:windows\x00f", b"8192")
    assert Signer([NEW]).unseal("tailfloor:windows\x00f", after) == b"8192"
    assert Signer([OLD]).unseal("tailfloor:windows\x00f", after) is None


def test_without_a_key_values_are_as_written() -> None:
    signer = Signer()
    assert not signer.enabled
    assert signer.seal("k", b"v") == b"v" and signer.unseal("k", "v") == b"v"


def test_key_files(tmp_path: Path) -> None:
    (tmp_path / "k").write_bytes(b"  " + NEW + b"\n")
    assert read_key(tmp_path / "k") == NEW
    (tmp_path / "short").write_bytes(b"abc")
    for bad in ("short", "missing"):
        with pytest.raises(ValueError, match="store key file"):
            read_key(tmp_path / bad)


def test_the_credential_scope_differs_by_credential_and_hides_it(tmp_path: Path) -> None:
    [key] = scope_keys(None, tmp_path)
    assert scope_keys(None, tmp_path) == (key,)  # kept in the state directory
    assert (tmp_path / "credential-scope.key").stat().st_mode & 0o077 == 0
    a = credential_scope({"authorization": "Bearer sk-tenant-a-0001"}, key)
    b = credential_scope({"authorization": "Bearer sk-tenant-b-0002"}, key)
    c = credential_scope({"x-api-key": "sk-tenant-a-0001"}, key)
    assert a and b and c and len({a, b, c}) == 3
    assert "sk-tenant" not in a + b + c
    assert credential_scope({}, key) is None
    # replicas sharing a store agree; a store key changes every scope
    assert scope_keys((NEW,), None)[0] == scope_keys((NEW, OLD), tmp_path)[0]
    assert scope_keys((NEW, OLD), None)[1] == scope_keys((OLD,), None)[0]
    assert credential_scope({"x-api-key": "k"}, scope_keys((NEW,), None)[0]) != \
        credential_scope({"x-api-key": "k"}, scope_keys((OLD,), None)[0])
    assert scope_keys(None, None) != scope_keys(None, None)  # no state: one per process


def test_remembered_credential_scopes_are_the_hashes_themselves() -> None:
    """What ``CredentialScopes`` remembers is exactly ``credential_scope`` under each key, for
    the header that decides (authorization first), whitespace as sent; it forgets past its
    bound and never shows a credential."""
    keys = (NEW, OLD)
    scopes = CredentialScopes(keys)
    cases: list[dict[str, str]] = [
        {"authorization": "Bearer sk-a"}, {"authorization": " Bearer sk-a "},
        {"x-api-key": "sk-a"}, {"api-key": "sk-a"}, {"authorization": "", "x-api-key": "sk-b"},
        {"authorization": "Bearer sk-a", "x-api-key": "sk-b"}, {"x-api-key": "\udcff"}]
    for _ in range(2):  # first computed, then remembered
        for headers in cases:
            assert scopes.of(headers) == tuple(credential_scope(headers, k) for k in keys)
    assert scopes.of({}) is None and scopes.of({"authorization": ""}) is None
    assert "sk-" not in repr(scopes) and "Bearer" not in repr(scopes)
    small = CredentialScopes((NEW,))
    small.MAX_KEPT = 3
    for n in range(10):
        headers = {"authorization": f"Bearer sk-{n}"}
        assert small.of(headers) == (credential_scope(headers, NEW),)
        assert len(small._kept) <= 3
