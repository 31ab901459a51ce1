# frozen_string_literal: true

require "fileutils"
require "openssl"
require "tmpdir"

# Certificates for a TLS broker and its clients, made in a temporary
# directory with Ruby's OpenSSL: a CA, a server certificate for localhost
# and 127.0.0.1 signed by it, a client certificate, an expired server
# certificate, and a second CA with a client certificate of its own (what a
# client trusting the wrong CA, or presenting the wrong certificate, has).
# EC P-256 keys: generated in milliseconds, where RSA takes a while.
class TLSCertificates
  attr_reader :dir

  def initialize
    @dir = Dir.mktmpdir("acemq-tls")
    @serial = 0
    @ca_key, @ca = authority("AceMQ test CA")
    write("ca.pem", @ca)
    @other_key, @other_ca = authority("Another CA")
    write("other-ca.pem", @other_ca)
    now = Time.now
    leaf("server", @ca, @ca_key, server: true, from: now - 3600, to: now + 86_400)
    leaf("expired", @ca, @ca_key, server: true, from: now - (3 * 86_400), to: now - 86_400)
    leaf("client", @ca, @ca_key, server: false, from: now - 3600, to: now + 86_400)
    leaf("stranger", @other_ca, @other_key, server: false, from: now - 3600, to: now + 86_400)
  end

  def path(name) = File.join(@dir, name)

  def remove = FileUtils.rm_rf(@dir)

  private

  def key = OpenSSL::PKey::EC.generate("prime256v1")

  def certificate(subject, key, issuer, issuer_key, from:, to:)
    cert = OpenSSL::X509::Certificate.new
    cert.version = 2
    cert.serial = (@serial += 1)
    cert.subject = OpenSSL::X509::Name.parse("/CN=#{subject}")
    cert.issuer = issuer ? issuer.subject : cert.subject
    cert.public_key = key
    cert.not_before = from
    cert.not_after = to
    ef = OpenSSL::X509::ExtensionFactory.new
    ef.subject_certificate = cert
    ef.issuer_certificate = issuer || cert
    yield cert, ef
    cert.add_extension(ef.create_extension("subjectKeyIdentifier", "hash", false))
    cert.sign(issuer_key || key, OpenSSL::Digest.new("SHA256"))
    cert
  end

  def authority(name)
    k = key
    now = Time.now
    cert = certificate(name, k, nil, nil, from: now - 3600, to: now + (10 * 86_400)) do |c, ef|
      c.add_extension(ef.create_extension("basicConstraints", "CA:TRUE", true))
      c.add_extension(ef.create_extension("keyUsage", "keyCertSign,cRLSign,digitalSignature", true))
    end
    [k, cert]
  end

  def leaf(name, ca, ca_key, server:, from:, to:)
    k = key
    cert = certificate(server ? "localhost" : "acemq-client", k, ca, ca_key, from: from, to: to) do |c, ef|
      c.add_extension(ef.create_extension("basicConstraints", "CA:FALSE", true))
      c.add_extension(ef.create_extension("keyUsage", "digitalSignature,keyAgreement", true))
      c.add_extension(ef.create_extension("extendedKeyUsage", server ? "serverAuth" : "clientAuth", false))
      c.add_extension(ef.create_extension("subjectAltName", "DNS:localhost,IP:127.0.0.1", false)) if server
    end
    write("#{name}.pem", cert)
    File.write(path("#{name}.key"), k.private_to_pem)
  end

  def write(name, cert) = File.write(path(name), cert.to_pem)
end
