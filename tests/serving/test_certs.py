"""Tests for webhook.serving.certs: real keys, real certificates, real TLS handshakes over a socket pair."""

from __future__ import annotations

import ipaddress
import os
import shutil
import ssl
import stat
import threading
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from tests.serving.certreads import cert, cert_public_der, contents, handshake, public_der, sans
from webhook.serving.certs import (
    Action,
    CertError,
    CertificateExpiry,
    CertReport,
    check_days,
    check_namespace,
    check_service,
    dns_names,
    ensure_certificates,
    parse_host,
    read_ca_bundle,
    serving_names,
)

SVC, NS = "gpupool-webhook", "gpupool-system"
SNI = "gpupool-webhook.gpupool-system.svc"
HOSTS = ("localhost", "127.0.0.1", "::1")
FILES = ("ca.crt", "ca.key", "tls.crt", "tls.key")


def ensure(directory: Path, *, hosts: tuple[str, ...] = HOSTS, now: datetime | None = None) -> CertReport:
    return ensure_certificates(directory, SVC, NS, hosts, 365, now=now)


@pytest.fixture(scope="module")
def generated(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, CertReport]:
    """One set of certificates for the whole module (key generation and signing are the slow part)."""
    directory = tmp_path_factory.mktemp("generated") / "certs"
    return directory, ensure(directory)


@pytest.fixture(scope="module")
def other(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A second, unrelated CA and serving certificate for the same names."""
    directory = tmp_path_factory.mktemp("other") / "certs"
    ensure(directory)
    return directory


@pytest.fixture
def certs(tmp_path: Path, generated: tuple[Path, CertReport]) -> Path:
    """A private copy of the generated certificates that a test may change."""
    copy = tmp_path / "certs"
    shutil.copytree(generated[0], copy)
    return copy


# --- what is generated ---------------------------------------------------------------------------


class TestGenerated:
    def test_writes_the_four_files_with_private_keys(self, generated: tuple[Path, CertReport]) -> None:
        """A first run creates exactly ca.crt, ca.key, tls.crt, tls.key: keys 0600, certificates 0644."""
        directory, report = generated
        assert sorted(p.name for p in directory.iterdir()) == sorted(FILES)  # no temporary files left
        modes = {name: stat.S_IMODE((directory / name).stat().st_mode) for name in FILES}
        assert modes == {"ca.crt": 0o644, "ca.key": 0o600, "tls.crt": 0o644, "tls.key": 0o600}
        assert [(f.path.name, f.action) for f in report.files] == [
            ("ca.key", Action.CREATED),
            ("ca.crt", Action.CREATED),
            ("tls.key", Action.CREATED),
            ("tls.crt", Action.CREATED),
        ]

    def test_serving_certificate_is_signed_by_the_ca(self, generated: tuple[Path, CertReport]) -> None:
        """tls.crt names the CA as issuer and its signature verifies with the CA's public key."""
        directory, _ = generated
        ca, leaf = cert(directory, "ca.crt"), cert(directory, "tls.crt")
        ca_public = ca.public_key()
        assert isinstance(ca_public, ec.EllipticCurvePublicKey)
        assert leaf.signature_hash_algorithm is not None
        ca_public.verify(leaf.signature, leaf.tbs_certificate_bytes, ec.ECDSA(leaf.signature_hash_algorithm))
        assert leaf.issuer == ca.subject

    def test_keys_are_p256_and_match_their_certificates(self, generated: tuple[Path, CertReport]) -> None:
        """Both keys are ECDSA P-256 and each certificate carries its key's public half."""
        directory, _ = generated
        for key_name, cert_name in (("ca.key", "ca.crt"), ("tls.key", "tls.crt")):
            key = serialization.load_pem_private_key((directory / key_name).read_bytes(), password=None)
            assert isinstance(key, ec.EllipticCurvePrivateKey)
            assert isinstance(key.curve, ec.SECP256R1)
            assert public_der(directory, key_name) == cert_public_der(cert(directory, cert_name))

    def test_subject_alternative_names_are_exactly_the_service_names_and_hosts(
        self, generated: tuple[Path, CertReport]
    ) -> None:
        """SANs: svc, svc.ns, svc.ns.svc, svc.ns.svc.cluster.local, then --host names; IPs as IP SANs."""
        leaf = cert(generated[0], "tls.crt")
        dns, ips = sans(leaf)
        assert dns == [
            "gpupool-webhook",
            "gpupool-webhook.gpupool-system",
            "gpupool-webhook.gpupool-system.svc",
            "gpupool-webhook.gpupool-system.svc.cluster.local",
            "localhost",
        ]
        assert ips == {ipaddress.ip_address("127.0.0.1"), ipaddress.ip_address("::1")}
        assert leaf.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value == SNI

    def test_ca_is_a_critical_ca_that_only_signs_certificates(self, generated: tuple[Path, CertReport]) -> None:
        """The CA has basicConstraints CA:true (critical), keyCertSign+cRLSign, an SKI and 10 years."""
        ca = cert(generated[0], "ca.crt")
        basic = ca.extensions.get_extension_for_class(x509.BasicConstraints)
        assert basic.critical
        assert basic.value.ca
        usage = ca.extensions.get_extension_for_class(x509.KeyUsage).value
        assert (usage.key_cert_sign, usage.crl_sign, usage.digital_signature) == (True, True, False)
        ski = ca.extensions.get_extension_for_class(x509.SubjectKeyIdentifier).value
        assert ski == x509.SubjectKeyIdentifier.from_public_key(ca.public_key())
        lifetime = ca.not_valid_after_utc - ca.not_valid_before_utc
        assert timedelta(days=3650) < lifetime < timedelta(days=3651)

    def test_serving_certificate_is_for_server_auth_only(self, generated: tuple[Path, CertReport]) -> None:
        """tls.crt: CA:false, serverAuth, digitalSignature only (ECDSA), AKI = the CA's key identifier."""
        directory, _ = generated
        ca, leaf = cert(directory, "ca.crt"), cert(directory, "tls.crt")
        assert not leaf.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
        assert list(leaf.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value) == [
            ExtendedKeyUsageOID.SERVER_AUTH
        ]
        usage = leaf.extensions.get_extension_for_class(x509.KeyUsage).value
        assert (usage.digital_signature, usage.key_encipherment, usage.key_cert_sign) == (True, False, False)
        aki = leaf.extensions.get_extension_for_class(x509.AuthorityKeyIdentifier).value
        ski = ca.extensions.get_extension_for_class(x509.SubjectKeyIdentifier).value
        assert aki.key_identifier == ski.digest

    def test_validity_is_backdated_for_clock_skew(self, generated: tuple[Path, CertReport]) -> None:
        """Both certificates start a few minutes in the past; the serving one lasts --days (365)."""
        directory, report = generated
        for name in ("ca.crt", "tls.crt"):
            c = cert(directory, name)
            assert c.not_valid_before_utc <= datetime.now(UTC) - timedelta(minutes=4)
        leaf = cert(directory, "tls.crt")
        assert leaf.not_valid_after_utc == report.not_after
        assert leaf.not_valid_after_utc - leaf.not_valid_before_utc == timedelta(days=365, minutes=5)


class TestHandshake:
    @pytest.mark.parametrize(
        "name",
        [SNI, "gpupool-webhook.gpupool-system.svc.cluster.local", "localhost", "127.0.0.1", "::1"],
    )
    def test_client_trusting_ca_crt_accepts_every_san(self, generated: tuple[Path, CertReport], name: str) -> None:
        """A client that trusts only ca.crt completes a TLS handshake for each service name and IP."""
        directory, _ = generated
        peer = handshake(directory, name)
        assert peer == cert(directory, "tls.crt").public_bytes(serialization.Encoding.DER)

    @pytest.mark.parametrize("name", ["other.example", "gpupool-webhook.other-namespace.svc", "127.0.0.2"])
    def test_name_not_in_the_sans_is_rejected(self, generated: tuple[Path, CertReport], name: str) -> None:
        """A host name or IP that is not a SAN fails verification."""
        with pytest.raises(ssl.SSLCertVerificationError, match="mismatch"):
            handshake(generated[0], name)

    def test_another_ca_is_not_trusted(self, generated: tuple[Path, CertReport], other: Path) -> None:
        """A client trusting a different gpupool CA rejects the server, although the names match."""
        with pytest.raises(ssl.SSLCertVerificationError, match="unable to get local issuer"):
            handshake(generated[0], SNI, ca_dir=other)


# --- running again -------------------------------------------------------------------------------


class TestRerun:
    def test_rerun_keeps_every_file_byte_for_byte(self, certs: Path) -> None:
        """A second run with the same options changes nothing and reports every file as kept."""
        before = contents(certs)
        report = ensure(certs)
        assert contents(certs) == before
        assert [f.action for f in report.files] == [Action.KEPT] * 4
        assert not report.changed

    def test_changed_host_renews_only_the_serving_certificate(self, certs: Path) -> None:
        """A new --host re-issues tls.crt for the same tls.key; the CA files are untouched."""
        before = contents(certs)
        report = ensure(certs, hosts=(*HOSTS, "webhook.example.internal"))
        after = contents(certs)
        assert {n for n in FILES if before[n] != after[n]} == {"tls.crt"}
        assert report.tls_cert.action is Action.RENEWED
        assert report.tls_cert.reason.startswith("names changed: added webhook.example.internal;")
        assert "webhook.example.internal" in sans(cert(certs, "tls.crt"))[0]
        handshake(certs, "webhook.example.internal")

    def test_reader_never_sees_a_mismatched_or_partial_pair_during_renewals(self, certs: Path) -> None:
        """While tls.crt is renewed over and over, a server re-loading tls.crt + tls.key (as gunicorn does
        for each connection) always gets a complete certificate that matches the key."""
        errors: list[Exception] = []
        loads = 0
        stop = threading.Event()

        def reader() -> None:
            nonlocal loads
            while not stop.is_set():
                ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
                try:
                    ctx.load_cert_chain(certs / "tls.crt", certs / "tls.key")
                except (ssl.SSLError, OSError) as exc:
                    errors.append(exc)
                loads += 1

        thread = threading.Thread(target=reader, daemon=True)
        thread.start()
        try:
            for i in range(20):
                report = ensure(certs, hosts=(*HOSTS, f"round{i % 2}.example"))
                assert report.tls_cert.action is Action.RENEWED
                wanted, deadline = loads + 2, datetime.now(UTC) + timedelta(seconds=30)
                while loads < wanted and datetime.now(UTC) < deadline:  # let the reader see this version
                    stop.wait(0.001)
        finally:
            stop.set()
            thread.join(timeout=30)
        assert errors == []
        assert loads >= 40

    def test_dropped_host_renews_and_says_which_name_went(self, certs: Path) -> None:
        """Removing a host is a names change too, and the reason names the removed SAN."""
        report = ensure(certs, hosts=("localhost",))
        assert report.tls_cert.action is Action.RENEWED
        assert report.tls_cert.reason.startswith("names changed: removed 127.0.0.1, ::1;")
        assert sans(cert(certs, "tls.crt"))[1] == set()

    def test_serving_certificate_with_more_than_30_days_left_is_kept(
        self, certs: Path, generated: tuple[Path, CertReport]
    ) -> None:
        """31 days before expiry nothing is renewed."""
        report = ensure(certs, now=generated[1].not_after - timedelta(days=31))
        assert not report.changed

    def test_serving_certificate_within_30_days_of_expiry_is_renewed(
        self, certs: Path, generated: tuple[Path, CertReport]
    ) -> None:
        """30 days before expiry tls.crt is renewed for another --days from `now`; the CA is kept."""
        now = generated[1].not_after - timedelta(days=30)
        before = contents(certs)
        report = ensure(certs, now=now)
        assert report.tls_cert.action is Action.RENEWED
        assert report.tls_cert.reason.startswith("expires on ")
        assert {n for n in FILES if before[n] != contents(certs)[n]} == {"tls.crt"}
        assert cert(certs, "tls.crt").not_valid_after_utc == (now + timedelta(days=365)).replace(microsecond=0)

    def test_expired_serving_certificate_is_renewed(self, certs: Path, generated: tuple[Path, CertReport]) -> None:
        """After expiry the reason says so."""
        report = ensure(certs, now=generated[1].not_after + timedelta(days=1))
        assert report.tls_cert.action is Action.RENEWED
        assert report.tls_cert.reason.startswith("expired on ")

    def test_expiring_ca_is_renewed_and_the_serving_certificate_re_signed(self, certs: Path) -> None:
        """A CA with 30 days or less left is re-issued for the same key, and tls.crt is re-signed by it;
        the old ca.crt still verifies the new tls.crt, so a caBundle can roll over in any order."""
        old_ca = cert(certs, "ca.crt")
        ca_end = old_ca.not_valid_after_utc
        first = ensure(certs, now=ca_end - timedelta(days=100))  # CA kept, tls.crt long expired
        assert (first.ca_cert.action, first.tls_cert.action) == (Action.KEPT, Action.RENEWED)
        before = contents(certs)

        report = ensure(certs, now=ca_end - timedelta(days=20))  # tls.crt itself has 345 days left
        after = contents(certs)
        assert {n for n in FILES if before[n] != after[n]} == {"ca.crt", "tls.crt"}
        assert report.ca_cert.action is Action.RENEWED
        assert report.ca_cert.reason.startswith("expires on ")
        assert report.tls_cert.reason.startswith("the CA was renewed")
        new_ca, leaf = cert(certs, "ca.crt"), cert(certs, "tls.crt")
        assert new_ca.not_valid_after_utc > ca_end
        leaf.verify_directly_issued_by(new_ca)
        leaf.verify_directly_issued_by(old_ca)

    def test_mismatched_serving_key_gets_a_matching_certificate(self, certs: Path, other: Path) -> None:
        """If tls.key is not the key of tls.crt, tls.crt is re-issued for tls.key (the key is kept)."""
        shutil.copy2(other / "tls.key", certs / "tls.key")
        report = ensure(certs)
        assert report.tls_cert.action is Action.RENEWED
        assert report.tls_cert.reason.startswith("does not match tls.key")
        assert report.tls_key.action is Action.KEPT
        assert (certs / "tls.key").read_bytes() == (other / "tls.key").read_bytes()
        assert cert_public_der(cert(certs, "tls.crt")) == public_der(certs, "tls.key")
        handshake(certs, SNI)

    def test_a_ca_key_that_is_not_the_key_of_ca_crt_is_refused_naming_both(self, certs: Path, other: Path) -> None:
        """A ca.key that does not belong to ca.crt (planted, or copied from another install) stops the run
        with an error naming both files, and nothing is written: no CA is ever issued from it."""
        shutil.copy2(other / "ca.key", certs / "ca.key")
        before = contents(certs)
        with pytest.raises(CertError) as refused:
            ensure(certs)
        assert str(refused.value).startswith(f"{certs / 'ca.key'} is not the key of {certs / 'ca.crt'}")
        assert "remove both to make a new CA" in str(refused.value)
        assert contents(certs) == before

    def test_serving_certificate_from_another_ca_is_replaced(self, certs: Path, other: Path) -> None:
        """A tls.crt/tls.key pair signed by some other CA is re-signed by ours (keeping tls.key)."""
        shutil.copy2(other / "tls.crt", certs / "tls.crt")
        shutil.copy2(other / "tls.key", certs / "tls.key")
        report = ensure(certs)
        assert report.tls_cert.reason.startswith("not signed by the current CA")
        assert report.tls_key.action is Action.KEPT
        handshake(certs, SNI)

    def test_missing_serving_key_creates_a_new_key_and_certificate(self, certs: Path) -> None:
        """Without tls.key a new key is generated and tls.crt re-issued for it."""
        (certs / "tls.key").unlink()
        report = ensure(certs)
        assert report.tls_key.action is Action.CREATED
        assert report.tls_cert.reason.startswith("tls.key is new")
        assert stat.S_IMODE((certs / "tls.key").stat().st_mode) == 0o600
        handshake(certs, SNI)

    def test_missing_serving_certificate_is_created(self, certs: Path) -> None:
        """Without tls.crt only tls.crt is written."""
        before = contents(certs)
        (certs / "tls.crt").unlink()
        report = ensure(certs)
        assert report.tls_cert.action is Action.CREATED
        assert {n for n in FILES if before[n] != contents(certs)[n]} == {"tls.crt"}

    def test_missing_ca_key_makes_a_new_ca(self, certs: Path) -> None:
        """Without ca.key a new CA is made (new key, new ca.crt) and tls.crt is re-signed by it."""
        old_ca = cert(certs, "ca.crt")
        (certs / "ca.key").unlink()
        report = ensure(certs)
        assert report.ca_key.action is Action.CREATED
        assert report.ca_cert.reason.startswith("ca.key was missing")
        assert report.tls_cert.reason.startswith("the CA was renewed")
        assert cert_public_der(cert(certs, "ca.crt")) != cert_public_der(old_ca)
        handshake(certs, SNI)

    def test_unreadable_serving_certificate_is_replaced(self, certs: Path) -> None:
        """A tls.crt that is not PEM is re-issued rather than reported: nothing depends on its bytes."""
        (certs / "tls.crt").write_bytes(b"not a certificate\n")
        report = ensure(certs)
        assert report.tls_cert.action is Action.RENEWED
        assert report.tls_cert.reason.startswith("not a PEM certificate, replaced")
        handshake(certs, SNI)

    @pytest.mark.parametrize("name", ["ca.crt", "ca.key", "tls.key"])
    def test_unreadable_ca_or_key_is_an_error_naming_the_file(self, certs: Path, name: str) -> None:
        """A corrupt CA certificate or key stops the run with the file's path and changes nothing."""
        (certs / name).write_bytes(b"-----BEGIN GARBAGE-----\n")
        before = contents(certs)
        with pytest.raises(CertError, match=f"{certs / name}: not a PEM"):
            ensure(certs, hosts=("new.example",))
        assert contents(certs) == before

    def test_encrypted_key_is_an_error(self, certs: Path) -> None:
        """A password-protected key cannot be used unattended; the error says so and names the file."""
        key = ec.generate_private_key(ec.SECP256R1())
        pem = key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.BestAvailableEncryption(b"secret"),
        )
        (certs / "tls.key").write_bytes(pem)
        with pytest.raises(CertError, match=r"tls\.key: the key is encrypted"):
            ensure(certs)

    def test_kept_key_readable_by_others_is_made_private(self, certs: Path) -> None:
        """A kept key with mode 0644 is set to 0600, and the report says so."""
        (certs / "ca.key").chmod(0o644)
        report = ensure(certs)
        assert stat.S_IMODE((certs / "ca.key").stat().st_mode) == 0o600
        assert report.ca_key.reason.endswith("permissions tightened to 0600")

    @pytest.mark.parametrize("umask", [0o000, 0o022, 0o277], ids=["umask-000", "umask-022", "umask-277"])
    def test_a_new_directory_is_0700_whatever_the_umask(self, tmp_path: Path, umask: int) -> None:
        """The directory is created for its owner alone, even under umask 000 (which would make it 0777) or a
        umask that would leave the owner unable to write; the report says it was created."""
        directory = tmp_path / "certs"
        old = os.umask(umask)
        try:
            report = ensure(directory)
        finally:
            os.umask(old)
        assert stat.S_IMODE(directory.stat().st_mode) == 0o700
        assert report.directory is not None
        assert (report.directory.action, report.directory.reason) == (Action.CREATED, "new directory, mode 0700")
        assert report.lines[0] == f"created {directory}: new directory, mode 0700"

    def test_an_existing_directory_others_may_write_to_is_tightened(self, certs: Path) -> None:
        """An existing directory keeps its mode unless group or others may write to it: those bits go, and
        the report says so; one already private is left alone and not reported."""
        certs.chmod(0o777)
        report = ensure(certs)
        assert stat.S_IMODE(certs.stat().st_mode) == 0o755
        assert report.directory is not None
        assert report.directory.reason == "others could write to it: permissions tightened to 0755"
        again = ensure(certs)
        assert again.directory is None
        assert len(again.lines) == 4

    def test_existing_rsa_serving_key_is_kept_and_allowed_key_encipherment(self, certs: Path) -> None:
        """An RSA tls.key is accepted; its certificate has keyUsage digitalSignature + keyEncipherment."""
        key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        pem = key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
        (certs / "tls.key").write_bytes(pem)
        report = ensure(certs)
        assert report.tls_key.reason == "RSA 2048 key"
        usage = cert(certs, "tls.crt").extensions.get_extension_for_class(x509.KeyUsage).value
        assert (usage.digital_signature, usage.key_encipherment) == (True, True)
        handshake(certs, SNI)

    def test_naive_now_is_rejected(self, certs: Path) -> None:
        """`now` must carry a time zone; a naive datetime would silently mean local time."""
        with pytest.raises(ValueError, match="timezone-aware"):
            ensure(certs, now=datetime(2030, 1, 1))


# --- the serving certificate's expiry (the gauge) -------------------------------------------------


class TestExpiry:
    def test_not_after_follows_the_file_through_a_renewal(self, certs: Path) -> None:
        """notAfter of tls.crt; after `gpupool certs` renews it (one rename), the renewed one's."""
        expiry = CertificateExpiry(str(certs / "tls.crt"))
        assert expiry.not_after() == cert(certs, "tls.crt").not_valid_after_utc
        later = datetime.now(UTC) + timedelta(days=340)  # within 30 days of the end: renewal is due
        report = ensure_certificates(certs, SVC, NS, HOSTS, 90, now=later)
        assert report.tls_cert.action is Action.RENEWED
        assert expiry.not_after() == report.not_after == cert(certs, "tls.crt").not_valid_after_utc

    def test_a_missing_or_half_written_file_keeps_the_last_value(self, certs: Path) -> None:
        """Mid-rotation (file gone, or not PEM yet) the last notAfter read stands, as the server keeps
        serving the certificate it had; a file never read gives None."""
        path = certs / "tls.crt"
        expiry = CertificateExpiry(str(path))
        first = expiry.not_after()
        path.write_bytes(b"-----BEGIN CERT")
        assert expiry.not_after() == first
        path.unlink()
        assert expiry.not_after() == first
        assert CertificateExpiry(str(path)).not_after() is None


# --- a client CA file (serve --client-ca) ----------------------------------------------------------


class TestCaBundle:
    def test_ca_certificates_are_read_old_and_new_together(
        self, generated: tuple[Path, CertReport], other: Path, tmp_path: Path
    ) -> None:
        """A file with two CAs (the state during a CA rotation) gives both."""
        bundle = tmp_path / "ca.crt"
        bundle.write_bytes((generated[0] / "ca.crt").read_bytes() + (other / "ca.crt").read_bytes())
        assert [c.fingerprint(hashes.SHA256()) for c in read_ca_bundle(bundle)] == [
            cert(d, "ca.crt").fingerprint(hashes.SHA256()) for d in (generated[0], other)
        ]

    @pytest.mark.parametrize(
        ("name", "words"),
        [
            ("tls.crt", "is not a CA certificate (no basicConstraints CA:TRUE)"),
            ("tls.key", "not a PEM certificate file; accepted: the PEM certificate(s) of the CA"),
            ("missing.crt", "no such file"),
        ],
        ids=["serving-certificate", "a-key", "missing"],
    )
    def test_what_is_no_ca_file_is_an_error_naming_it(
        self, generated: tuple[Path, CertReport], name: str, words: str
    ) -> None:
        """A certificate that is no CA, a key, or no file at all: CertError naming the file and the fault."""
        path = generated[0] / name
        with pytest.raises(CertError) as info:
            read_ca_bundle(path)
        assert str(info.value).startswith(f"{path}: ") and words in str(info.value)

    def test_an_expired_ca_is_an_error(self, generated: tuple[Path, CertReport]) -> None:
        """A CA past its end (10 years) would refuse every client: CertError saying when it expired."""
        expires = cert(generated[0], "ca.crt").not_valid_after_utc
        with pytest.raises(CertError, match=f"expired on {expires:%Y-%m-%d}"):
            read_ca_bundle(generated[0] / "ca.crt", now=expires + timedelta(days=1))


# --- names and arguments -------------------------------------------------------------------------


class TestNames:
    def test_dns_names_are_the_four_in_cluster_names(self) -> None:
        """dns_names gives the Service's short, namespaced, .svc and cluster.local names."""
        assert dns_names("web", "team-a") == ["web", "web.team-a", "web.team-a.svc", "web.team-a.svc.cluster.local"]

    @pytest.mark.parametrize(
        ("value", "expected"),
        [
            pytest.param("LocalHost.", "localhost", id="lowercased-trailing-dot-dropped"),
            pytest.param("webhook.example.com", "webhook.example.com", id="dns-name"),
            pytest.param("10.0.0.1", ipaddress.IPv4Address("10.0.0.1"), id="ipv4"),
            pytest.param("fd00::1", ipaddress.IPv6Address("fd00::1"), id="ipv6"),
        ],
    )
    def test_host_is_an_ip_or_a_dns_name(self, value: str, expected: object) -> None:
        """--host values become IP SANs when they parse as addresses, else normalized DNS names."""
        assert parse_host(value) == expected

    @pytest.mark.parametrize(
        "value",
        [
            pytest.param("bad host!", id="space-and-bang"),
            pytest.param("-lead.example", id="leading-hyphen"),
            pytest.param("a..b", id="empty-label"),
            pytest.param("", id="empty"),
            pytest.param("x" * 64 + ".example", id="label-too-long"),
            pytest.param("10.0.0.256", id="bad-ipv4"),
            pytest.param("fe80::1%eth0", id="ipv6-zone"),
            pytest.param("under_score.example", id="underscore"),
        ],
    )
    def test_bad_host_is_rejected(self, value: str) -> None:
        """A --host that is neither an IP address nor a DNS name raises ValueError."""
        with pytest.raises(ValueError, match="IP address"):
            parse_host(value)

    def test_duplicate_hosts_are_dropped(self) -> None:
        """Hosts equal to a service name or given twice appear once."""
        names = serving_names("web", "ns", ["web.ns.svc", "127.0.0.1", "127.0.0.1", "LOCALHOST", "localhost"])
        assert names.dns == ("web", "web.ns", "web.ns.svc", "web.ns.svc.cluster.local", "localhost")
        assert names.ips == (ipaddress.IPv4Address("127.0.0.1"),)
        assert names.common_name == "web.ns.svc"

    @pytest.mark.parametrize("name", ["Webhook", "1webhook", "web_hook", "w" * 64])
    def test_bad_service_name_is_rejected(self, name: str) -> None:
        """Service names are RFC 1035 labels."""
        with pytest.raises(ValueError, match="not a valid Service name"):
            check_service(name)

    @pytest.mark.parametrize("name", ["Team", "team_a", "team-", "n" * 64])
    def test_bad_namespace_is_rejected(self, name: str) -> None:
        """Namespaces are RFC 1123 labels."""
        with pytest.raises(ValueError, match="not a valid namespace name"):
            check_namespace(name)

    @pytest.mark.parametrize(("days", "ok"), [(0, False), (30, False), (31, True), (3650, True), (3651, False)])
    def test_days_must_outlast_the_renewal_window(self, days: int, ok: bool) -> None:
        """--days must be more than the 30-day renewal window (else every run renews) and at most 10 years."""
        if ok:
            assert check_days(days) == days
        else:
            with pytest.raises(ValueError, match="out of range"):
                check_days(days)
