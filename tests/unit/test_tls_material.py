"""TLS material is loaded into a new context each time, or refused with the setting, the file
and the reason named (``proxy.server.tls``)."""

import subprocess

import pytest

from harness.certificates import make_ca, make_server_cert
from proxy.server.tls import certificate_fingerprint, load_listener_tls, load_upstream_tls
from proxy.settings import ConfigError


@pytest.fixture(scope="module")
def material(tmp_path_factory):
    directory = tmp_path_factory.mktemp("tls")
    ca = make_ca(directory)
    return directory, ca, make_server_cert(ca, directory, 1001), make_server_cert(ca, directory, 1002)


def _openssl_fingerprint(path) -> str:
    out = subprocess.run(["openssl", "x509", "-noout", "-fingerprint", "-sha256", "-in", str(path)],
                         check=True, capture_output=True, text=True).stdout
    return out.strip().split("=", 1)[1]


def test_a_listener_context_and_the_fingerprint_openssl_shows(material):
    _, _, first, second = material
    loaded = load_listener_tls(str(first.cert), str(first.key))
    assert loaded.fingerprint == _openssl_fingerprint(first.cert)
    again = load_listener_tls(str(first.cert), str(first.key))
    assert again.context is not loaded.context, "each load builds a new context: open connections keep theirs"
    assert load_listener_tls(str(second.cert), str(second.key)).fingerprint != loaded.fingerprint


def test_the_fingerprint_is_of_the_leaf_of_a_chain(material):
    directory, ca, first, _ = material
    chain = directory / "chain.pem"
    chain.write_bytes(first.cert.read_bytes() + ca.cert.read_bytes())
    assert certificate_fingerprint(chain.read_bytes()) == _openssl_fingerprint(first.cert)
    assert load_listener_tls(str(chain), str(first.key)).fingerprint == _openssl_fingerprint(first.cert)


def test_no_certificate_no_fingerprint():
    assert certificate_fingerprint(b"") is None
    assert certificate_fingerprint(b"-----BEGIN CERTIFICATE-----\n@@@\n-----END CERTIFICATE-----\n") is None


def test_a_key_that_does_not_match_the_certificate_is_refused(material):
    _, _, first, second = material
    with pytest.raises(ConfigError) as caught:
        load_listener_tls(str(first.cert), str(second.key))
    assert str(caught.value) == (f"ssl.listener.keyfile: the key in {str(second.key)!r} does not match the "
                                 f"certificate in {str(first.cert)!r}")


def test_unreadable_files_are_refused_naming_the_setting(material, tmp_path):
    _, _, first, _ = material
    missing = tmp_path / "gone.pem"
    with pytest.raises(ConfigError, match=r"^ssl.listener.certfile: cannot read '.*gone.pem': No such file"):
        load_listener_tls(str(missing), str(first.key))
    with pytest.raises(ConfigError, match=r"^ssl.listener.keyfile: cannot read '.*gone.pem': No such file"):
        load_listener_tls(str(first.cert), str(missing))
    with pytest.raises(ConfigError, match=r"^ssl.listener.keyfile: cannot read '.*': Is a directory"):
        load_listener_tls(str(first.cert), str(tmp_path))


def test_files_without_pem_material_are_refused(material, tmp_path):
    _, _, first, _ = material
    junk = tmp_path / "junk.pem"
    junk.write_text("not a certificate\n")
    with pytest.raises(ConfigError, match=r"^ssl.listener.certfile: '.*junk.pem' holds no PEM certificate$"):
        load_listener_tls(str(junk), str(first.key))
    with pytest.raises(ConfigError, match=r"^ssl.listener.keyfile: '.*junk.pem' holds no PEM private key$"):
        load_listener_tls(str(first.cert), str(junk))
    # a key where the certificate belongs (they were swapped)
    with pytest.raises(ConfigError, match=r"^ssl.listener.certfile: '.*' holds no PEM certificate$"):
        load_listener_tls(str(first.key), str(first.cert))


def test_an_encrypted_key_is_refused_without_a_prompt(material, tmp_path):
    _, _, first, _ = material
    encrypted = tmp_path / "encrypted.key"
    subprocess.run(["openssl", "pkey", "-in", str(first.key), "-aes256", "-passout", "pass:secret", "-out",
                    str(encrypted)], check=True, capture_output=True)
    with pytest.raises(ConfigError, match=r"^ssl.listener.keyfile: the key in '.*encrypted.key' is encrypted"):
        load_listener_tls(str(first.cert), str(encrypted))


def test_upstream_ca_bundles(material, tmp_path):
    _, ca, _, _ = material
    assert load_upstream_tls(str(ca.cert), True).check_hostname is True
    assert load_upstream_tls("", False).check_hostname is False  # the system's store
    junk = tmp_path / "junk.pem"
    junk.write_text("nothing\n")
    with pytest.raises(ConfigError, match=r"^ssl.upstream.cafile: '.*junk.pem' holds no PEM certificate$"):
        load_upstream_tls(str(junk), True)
    with pytest.raises(ConfigError, match=r"^ssl.upstream.cafile: cannot read '.*missing.pem'"):
        load_upstream_tls(str(tmp_path / "missing.pem"), True)
