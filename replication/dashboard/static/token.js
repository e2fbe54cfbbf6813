// Token mode (the page served off loopback): the SAS token every API call carries. The page
// mints it from a key name and key pasted into the form, as the SDKs do (replication/
// servicebus/sas.py: HMAC-SHA256 of quote_plus(uri) + "\n" + expiry with the key's UTF-8
// bytes), or takes a ready token, or one the broker's --ui-token put in the URL after
// "#sas=". Only the token is kept, in sessionStorage (this tab, until it closes); the key is
// never stored, and the token goes nowhere but the Authorization header.
// crypto.subtle exists only in secure contexts (https, or localhost), and a page served off
// loopback over plain http is not one: there the small SHA-256 below signs instead.
"use strict";

const TOKEN_KEY = "sas-token";

const SHA256_K = new Uint32Array([
  0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4,
  0xab1c5ed5, 0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe,
  0x9bdc06a7, 0xc19bf174, 0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f,
  0x4a7484aa, 0x5cb0a9dc, 0x76f988da, 0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7,
  0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967, 0x27b70a85, 0x2e1b2138, 0x4d2c6dfc,
  0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85, 0xa2bfe8a1, 0xa81a664b,
  0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070, 0x19a4c116,
  0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
  0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7,
  0xc67178f2,
]);
const SHA256_H = [0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a, 0x510e527f, 0x9b05688c,
  0x1f83d9ab, 0x5be0cd19];

function sha256(bytes) {
  // FIPS 180-4 SHA-256 of a Uint8Array
  const ror = (x, n) => (x >>> n) | (x << (32 - n));
  const padded = new Uint8Array(((bytes.length + 72) >> 6) << 6);
  padded.set(bytes);
  padded[bytes.length] = 0x80;
  const view = new DataView(padded.buffer);
  view.setUint32(padded.length - 8, Math.floor(bytes.length / 0x20000000));
  view.setUint32(padded.length - 4, (bytes.length * 8) >>> 0);
  const hash = new Uint32Array(SHA256_H);
  const w = new Uint32Array(64);
  for (let at = 0; at < padded.length; at += 64) {
    for (let i = 0; i < 16; i++) w[i] = view.getUint32(at + i * 4);
    for (let i = 16; i < 64; i++) {
      const s0 = ror(w[i - 15], 7) ^ ror(w[i - 15], 18) ^ (w[i - 15] >>> 3);
      const s1 = ror(w[i - 2], 17) ^ ror(w[i - 2], 19) ^ (w[i - 2] >>> 10);
      w[i] = w[i - 16] + s0 + w[i - 7] + s1;
    }
    let [a, b, c, d, e, f, g, h] = hash;
    for (let i = 0; i < 64; i++) {
      const t1 = (h + (ror(e, 6) ^ ror(e, 11) ^ ror(e, 25)) + ((e & f) ^ (~e & g)) +
        SHA256_K[i] + w[i]) | 0;
      const t2 = ((ror(a, 2) ^ ror(a, 13) ^ ror(a, 22)) + ((a & b) ^ (a & c) ^ (b & c))) | 0;
      [h, g, f, e, d, c, b, a] = [g, f, e, (d + t1) | 0, c, b, a, (t1 + t2) | 0];
    }
    [a, b, c, d, e, f, g, h].forEach((v, i) => { hash[i] += v; });
  }
  const out = new Uint8Array(32);
  const outView = new DataView(out.buffer);
  hash.forEach((v, i) => outView.setUint32(i * 4, v));
  return out;
}

function hmacSha256Js(key, message) {
  // RFC 2104 over sha256 (64-byte blocks)
  const block = new Uint8Array(64);
  block.set(key.length > 64 ? sha256(key) : key);
  const inner = new Uint8Array(64 + message.length);
  const outer = new Uint8Array(64 + 32);
  for (let i = 0; i < 64; i++) {
    inner[i] = block[i] ^ 0x36;
    outer[i] = block[i] ^ 0x5c;
  }
  inner.set(message, 64);
  outer.set(sha256(inner), 64);
  return sha256(outer);
}

async function hmacSha256(key, message) {
  // Web Crypto where the page may use it, the function above where it may not
  if (!(window.crypto && crypto.subtle)) return hmacSha256Js(key, message);
  const imported = await crypto.subtle.importKey("raw", key, { name: "HMAC", hash: "SHA-256" },
    false, ["sign"]);
  return new Uint8Array(await crypto.subtle.sign("HMAC", imported, message));
}

function quotePlus(text) {
  // Python's urllib.parse.quote_plus: what the SDKs encode the resource and signature with
  return encodeURIComponent(text).replace(/[!'()*]/g,
    (c) => "%" + c.charCodeAt(0).toString(16).toUpperCase()).replace(/%20/g, "+");
}

async function mintToken(uri, keyName, key, expiry) {
  // "SharedAccessSignature sr=<quote_plus(uri)>&sig=...&se=<expiry>&skn=<key name>"
  const utf8 = new TextEncoder();
  const resource = quotePlus(uri);
  const signed = await hmacSha256(utf8.encode(key), utf8.encode(`${resource}\n${expiry}`));
  const signature = btoa(String.fromCharCode(...signed));
  return `SharedAccessSignature sr=${resource}&sig=${quotePlus(signature)}&se=${expiry}` +
    `&skn=${quotePlus(keyName)}`;
}

function tokenFromUrl() {
  // --ui-token: "#sas=<token>" moves to sessionStorage, and out of the address bar
  const match = /^#sas=(.+)$/.exec(location.hash);
  if (!match) return;
  sessionStorage.setItem(TOKEN_KEY, decodeURIComponent(match[1]));
  history.replaceState(null, "", location.pathname + location.search);
}

async function useTokenForm(event) {
  event.preventDefault();
  const form = $("token-form");
  let token = form.token.value.trim();
  if (!token) {
    const keyName = form.key_name.value.trim();
    const key = form.key.value;
    if (!keyName || !key) {
      $("token-why").textContent = "paste a key name and its key, or a SAS token";
      return;
    }
    const expiry = Math.floor(Date.now() / 1000) + Number(form.lifetime.value);
    token = await mintToken(`sb://${location.hostname}`, keyName, key, expiry);
  }
  form.reset();
  sessionStorage.setItem(TOKEN_KEY, token);
  location.reload();
}

function askForToken(why) {
  // the API said 401: the form, the reason, and a badge that says what it waits for
  $("token-form").hidden = false;
  if (why) $("token-why").textContent = why;
  $("live").textContent = "needs a token";
  $("live").classList.add("off");
}

tokenFromUrl();
document.getElementById("token-form").addEventListener("submit", (event) => {
  useTokenForm(event).catch((e) => { $("token-why").textContent = e.message; });
});
