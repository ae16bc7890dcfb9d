#include "http/tls.h"

#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>

#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"

namespace shardlm {
namespace {

// An OpenSSL BIO over PEM text.
struct PemBio {
  explicit PemBio(const std::string& pem)
      : bio(BIO_new_mem_buf(pem.data(), static_cast<int>(pem.size()))) {}
  ~PemBio() { BIO_free(bio); }
  BIO* bio;
};

std::string OpenSslError() {
  const unsigned long e = ERR_get_error();
  ERR_clear_error();
  if (e == 0) return "unknown error";
  char text[256];
  ERR_error_string_n(e, text, sizeof(text));
  return text;
}

}  // namespace

absl::StatusOr<SSL_CTX*> NewServerTlsContext(const TlsConfig& tls) {
  SSL_CTX* ctx = SSL_CTX_new(TLS_server_method());
  if (ctx == nullptr) return absl::InternalError("SSL_CTX_new failed");
  const auto fail = [&](const std::string& what) {
    SSL_CTX_free(ctx);
    return absl::InvalidArgumentError(
        absl::StrCat("TLS: ", what, ": ", OpenSslError()));
  };
  SSL_CTX_set_min_proto_version(ctx, TLS1_2_VERSION);
  SSL_CTX_set_mode(
      ctx, SSL_MODE_ENABLE_PARTIAL_WRITE | SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER);
  {
    PemBio in(tls.cert_chain_pem);
    X509* cert = PEM_read_bio_X509_AUX(in.bio, nullptr, nullptr, nullptr);
    if (cert == nullptr || SSL_CTX_use_certificate(ctx, cert) != 1) {
      X509_free(cert);
      return fail("the certificate (--tls-cert) does not load");
    }
    X509_free(cert);
    while (X509* extra = PEM_read_bio_X509(in.bio, nullptr, nullptr, nullptr)) {
      if (SSL_CTX_add_extra_chain_cert(ctx, extra) != 1) {
        X509_free(extra);
        return fail("a chain certificate in --tls-cert does not load");
      }
    }
    ERR_clear_error();  // The end of the PEM text.
  }
  {
    PemBio in(tls.private_key_pem);
    EVP_PKEY* key = PEM_read_bio_PrivateKey(in.bio, nullptr, nullptr, nullptr);
    const bool ok = key != nullptr && SSL_CTX_use_PrivateKey(ctx, key) == 1;
    EVP_PKEY_free(key);
    if (!ok) return fail("the key (--tls-key) does not load");
  }
  if (SSL_CTX_check_private_key(ctx) != 1) {
    return fail("--tls-key does not match --tls-cert");
  }
  if (!tls.client_ca_pem.empty()) {
    X509_STORE* store = SSL_CTX_get_cert_store(ctx);
    PemBio in(tls.client_ca_pem);
    int loaded = 0;
    while (X509* ca = PEM_read_bio_X509(in.bio, nullptr, nullptr, nullptr)) {
      loaded += X509_STORE_add_cert(store, ca) == 1;
      X509_free(ca);
    }
    ERR_clear_error();
    if (loaded == 0) return fail("no certificate in --tls-client-ca");
    SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER | SSL_VERIFY_FAIL_IF_NO_PEER_CERT,
                       nullptr);
  }
  return ctx;
}

absl::Status CheckKeyPair(const std::string& cert_pem,
                          const std::string& key_pem,
                          const std::string& cert_what,
                          const std::string& key_what) {
  BIO* cert_bio =
      BIO_new_mem_buf(cert_pem.data(), static_cast<int>(cert_pem.size()));
  X509* cert = PEM_read_bio_X509(cert_bio, nullptr, nullptr, nullptr);
  BIO_free(cert_bio);
  BIO* key_bio =
      BIO_new_mem_buf(key_pem.data(), static_cast<int>(key_pem.size()));
  EVP_PKEY* key = PEM_read_bio_PrivateKey(key_bio, nullptr, nullptr, nullptr);
  BIO_free(key_bio);
  absl::Status status;
  if (cert == nullptr) {
    status = absl::InvalidArgumentError(
        absl::StrCat(cert_what, " holds no certificate"));
  } else if (key == nullptr) {
    status = absl::InvalidArgumentError(
        absl::StrCat(key_what, " holds no private key (or an encrypted one)"));
  } else if (X509_check_private_key(cert, key) != 1) {
    status = absl::InvalidArgumentError(
        absl::StrCat(key_what, " does not match ", cert_what));
  }
  X509_free(cert);
  EVP_PKEY_free(key);
  ERR_clear_error();
  return status;
}

absl::Status CheckCertificates(const std::string& pem,
                               const std::string& what) {
  BIO* bio = BIO_new_mem_buf(pem.data(), static_cast<int>(pem.size()));
  int count = 0;
  while (X509* cert = PEM_read_bio_X509(bio, nullptr, nullptr, nullptr)) {
    X509_free(cert);
    ++count;
  }
  // The loop ends on the end of the text or on a block that does not parse.
  const unsigned long last = ERR_peek_last_error();
  const bool clean_end = ERR_GET_LIB(last) == ERR_LIB_PEM &&
                         ERR_GET_REASON(last) == PEM_R_NO_START_LINE;
  BIO_free(bio);
  ERR_clear_error();
  if (count == 0 || !clean_end) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, count == 0 ? " holds no certificate"
                         : " holds a certificate that does not parse"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> ReadPemFile(const std::string& path,
                                        const std::string& what) {
  constexpr std::streamoff kMaxBytes = 1 << 20;
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  if (!in) {
    return absl::NotFoundError(
        absl::StrCat(what, ": cannot open '", path, "'"));
  }
  const std::streamoff size = in.tellg();
  if (size <= 0 || size > kMaxBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": '", path, "' is ", size,
                     " bytes; a PEM file has 1 to ", kMaxBytes));
  }
  in.seekg(0);
  std::ostringstream text;
  text << in.rdbuf();
  std::string pem = text.str();
  if (pem.find("-----BEGIN ") == std::string::npos) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": '", path, "' is not PEM (no -----BEGIN line)"));
  }
  return pem;
}

absl::StatusOr<TlsConfig> LoadTlsConfig(const std::string& cert_file,
                                        const std::string& key_file,
                                        const std::string& client_ca_file) {
  TlsConfig tls;
  if (cert_file.empty() != key_file.empty()) {
    return absl::InvalidArgumentError(
        "--tls-cert and --tls-key go together: give both or neither");
  }
  if (cert_file.empty()) {
    if (!client_ca_file.empty()) {
      return absl::InvalidArgumentError(
          "--tls-client-ca needs --tls-cert and --tls-key");
    }
    return tls;
  }
  absl::StatusOr<std::string> cert = ReadPemFile(cert_file, "--tls-cert");
  if (!cert.ok()) return cert.status();
  absl::StatusOr<std::string> key = ReadPemFile(key_file, "--tls-key");
  if (!key.ok()) return key.status();
  if (absl::Status s = CheckKeyPair(*cert, *key, "--tls-cert", "--tls-key");
      !s.ok()) {
    return s;
  }
  tls.cert_chain_pem = *std::move(cert);
  tls.private_key_pem = *std::move(key);
  if (!client_ca_file.empty()) {
    absl::StatusOr<std::string> ca =
        ReadPemFile(client_ca_file, "--tls-client-ca");
    if (!ca.ok()) return ca.status();
    tls.client_ca_pem = *std::move(ca);
  }
  return tls;
}

}  // namespace shardlm
