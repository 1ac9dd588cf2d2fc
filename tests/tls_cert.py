"""A self-signed certificate (its own CA) and its key, made with the
openssl command: what the TLS tests give a server, and trust elsewhere."""
import subprocess


def self_signed(folder, *alt_names, stem="tls", common_name="plexus-test"):
    """(certificate, key): `folder`/`stem`.crt and .key, the certificate
    naming `alt_names` ("IP:127.0.0.1", "DNS:plexus-server") as the
    subject's alternative names."""
    cert, key = folder / f"{stem}.crt", folder / f"{stem}.key"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt",
         "ec_paramgen_curve:prime256v1", "-nodes", "-keyout", str(key),
         "-out", str(cert), "-days", "1", "-subj", f"/CN={common_name}",
         "-addext", "subjectAltName=" + ",".join(alt_names)],
        check=True, capture_output=True, timeout=60)
    return cert, key
