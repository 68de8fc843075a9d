// `llm download REPO_ID [--revision R] [--dir D] [--include GLOB]... [--exclude GLOB]...`
// Fetches a model folder from the Hugging Face Hub (or HF_ENDPOINT: a mirror, or the test's
// mock) as huggingface_hub does:
//   1. GET {endpoint}/api/models/{repo_id}/revision/{revision}: the commit ("sha") and the
//      file list ("siblings"[].rfilename);
//   2. per file, HEAD {endpoint}/{repo_id}/resolve/{commit}/{file}, following only relative
//      redirects (a renamed repo): X-Linked-Etag (LFS: the sha256) or ETag (a git blob sha1),
//      X-Linked-Size or Content-Length, and for LFS files the CDN's Location;
//   3. GET the file into FILE.incomplete (Range: bytes=N- when it holds N bytes already, so
//      a dropped connection or an interrupted run resumes), verify size and checksum, rename.
// Authorization: Bearer $HF_TOKEN goes to the Hub only, never to the CDN (a presigned URL
// that refuses a second credential). HTTPS through cpp-httplib's OpenSSL support (Debian's
// build has it); digests through OpenSSL's EVP. The folder path is printed to stdout.
// Test: tests/clients/run_download_test.sh (a loopback mock of the Hub and its CDN).
#include <fnmatch.h>
#include <httplib.h>
#include <openssl/evp.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "engine/error.h"
#include "engine/model/model_config.h"
#include "server/cli/commands.h"

namespace llm::cli {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

constexpr int kMaxAttempts = 5;  // per file: dropped connections, 5xx and 429 are retried
constexpr int kMaxRelativeRedirects = 5;

struct DownloadFlags {
  std::string repo_id;
  std::string revision = "main";
  std::string dir;  // default: the repository's name in the current folder
  std::vector<std::string> include, exclude;
};

// Where the files come from: endpoint without a trailing slash; token empty when unset.
struct Hub {
  std::string endpoint, token, repo_id, revision;
};

// "https://host[:port]/path?q" as origin "https://host[:port]" and target "/path?q".
struct Url {
  std::string origin, target;
};

Url SplitUrl(const std::string& url) {
  const size_t scheme_end = url.find("://");
  if (scheme_end == std::string::npos) throw Error("not an absolute URL: " + url);
  const size_t path_start = url.find('/', scheme_end + 3);
  if (path_start == std::string::npos) return {url, "/"};
  return {url.substr(0, path_start), url.substr(path_start)};
}

// Escapes all but RFC 3986's unreserved characters (and '/' when keep_slash): file names
// may hold spaces, and a revision such as "refs/pr/1" is one path segment.
std::string PercentEncode(std::string_view s, bool keep_slash) {
  static constexpr char kHex[] = "0123456789ABCDEF";
  std::string out;
  for (const unsigned char c : s) {
    if (std::isalnum(c) || c == '-' || c == '_' || c == '.' || c == '~' ||
        (keep_slash && c == '/')) {
      out += static_cast<char>(c);
    } else {
      out += {'%', kHex[c >> 4], kHex[c & 15]};
    }
  }
  return out;
}

// A transport failure (no HTTP answer) in words.
std::string DescribeError(httplib::Error error, const std::string& origin) {
  switch (error) {
    case httplib::Error::Connection:
    case httplib::Error::ConnectionTimeout:
      return "cannot connect to " + origin;
    case httplib::Error::Read:
      return "the connection to " + origin + " was lost";
    case httplib::Error::SSLServerVerification:
      return "the TLS certificate of " + origin + " is not trusted (ca-certificates?)";
    default:
      return httplib::to_string(error) + " error talking to " + origin;
  }
}

std::unique_ptr<httplib::Client> MakeClient(const std::string& origin) {
  auto client = std::make_unique<httplib::Client>(origin);
  if (!client->is_valid()) throw Error("unsupported URL (http:// or https://): " + origin);
  client->set_follow_location(false);  // followed here, so that the token stays on the Hub
  client->set_url_encode(false);       // targets are percent-encoded already
  client->set_decompress(false);       // byte offsets must be the file's (Range)
  client->set_connection_timeout(10);
  client->set_read_timeout(60);
  return client;
}

httplib::Headers RequestHeaders(const Hub& hub, bool to_hub) {
  httplib::Headers h{{"Accept-Encoding", "identity"}, {"User-Agent", "llm-download/1"}};
  if (to_hub && !hub.token.empty()) h.emplace("Authorization", "Bearer " + hub.token);
  return h;
}

// The Hub names its errors in X-Error-Code (RepoNotFound, RevisionNotFound, EntryNotFound,
// GatedRepo) and X-Error-Message: the status alone is ambiguous (anonymous callers get 401
// for a missing repository as for a private one).
[[noreturn]] void ThrowHubError(const httplib::Response& r, const Hub& hub,
                                const std::string& what) {
  const std::string code = r.get_header_value("X-Error-Code");
  const std::string message = r.get_header_value("X-Error-Message");
  std::string text = what + ": HTTP " + std::to_string(r.status);
  if (!code.empty()) text += " " + code;
  if (!message.empty()) text += " (" + message + ")";
  if (r.status == 401 || r.status == 403) {
    if (!hub.token.empty()) {
      text +=
          ". HF_TOKEN was sent and refused: check that it is valid and that its account "
          "has access to " +
          hub.repo_id +
          (code == "GatedRepo" ? " (a gated model: accept its conditions on its Hub page)" : "");
    } else if (code == "GatedRepo") {
      text += ". " + hub.repo_id + " is a gated model: accept its conditions on its Hub page, " +
              "then set HF_TOKEN to an access token of that account";
    } else {
      text +=
          ". The repository is gated, private or does not exist; if you have access, set "
          "HF_TOKEN to an access token (sent as Authorization: Bearer)";
    }
  } else if (r.status == 404) {
    if (code == "RevisionNotFound") {
      text += ". Revision '" + hub.revision + "' does not exist in " + hub.repo_id;
    } else if (code == "EntryNotFound") {
      text += ". The file is not in this revision";
    } else {
      text += ". Repository " + hub.repo_id + " not found (ids are owner/name) at " + hub.endpoint;
    }
  }
  throw Error(text);
}

struct RepoInfo {
  std::string commit;
  std::vector<std::string> files;
};

RepoInfo FetchRepoInfo(const Hub& hub) {
  const std::string what = "listing " + hub.repo_id + " at revision " + hub.revision;
  const Url url = SplitUrl(hub.endpoint + "/api/models/" + PercentEncode(hub.repo_id, true) +
                           "/revision/" + PercentEncode(hub.revision, false));
  auto r = MakeClient(url.origin)->Get(url.target, RequestHeaders(hub, true));
  if (!r) throw Error(what + ": " + DescribeError(r.error(), url.origin) + " (HF_ENDPOINT)");
  if (r->status != 200) ThrowHubError(*r, hub, what);
  const nlohmann::json j = nlohmann::json::parse(r->body, nullptr, false);
  if (!j.is_object() || !j.contains("sha") || !j["sha"].is_string() || !j.contains("siblings") ||
      !j["siblings"].is_array()) {
    throw Error(what + ": the answer has no \"sha\" and \"siblings\" (is HF_ENDPOINT a Hub?)");
  }
  RepoInfo info{j["sha"].get<std::string>(), {}};
  for (const nlohmann::json& s : j["siblings"]) {
    if (s.is_object() && s.contains("rfilename") && s["rfilename"].is_string()) {
      info.files.push_back(s["rfilename"].get<std::string>());
    }
  }
  return info;
}

// A name from the Hub becomes a path under --dir: refuse anything that could leave it.
bool IsSafeRelativePath(const std::string& name) {
  if (name.empty() || name.front() == '/' || name.find('\\') != std::string::npos) return false;
  for (const fs::path& part : fs::path(name)) {
    if (part.empty() || part == "." || part == "..") return false;
  }
  return true;
}

// --include / --exclude globs as huggingface_hub applies them (fnmatch: '*' matches '/').
bool IsWanted(const std::string& name, const DownloadFlags& f) {
  auto matches = [&](const std::vector<std::string>& globs) {
    return std::any_of(globs.begin(), globs.end(), [&](const std::string& g) {
      return fnmatch(g.c_str(), name.c_str(), 0) == 0;
    });
  };
  return (f.include.empty() || matches(f.include)) && !matches(f.exclude);
}

// What the Hub says about one file before it is fetched.
struct FileMeta {
  std::string name;
  std::string download_url;  // the CDN's presigned URL (LFS) or the resolve URL
  bool is_on_hub = true;     // whether download_url gets the token
  std::string etag;          // lowercase, unquoted: sha256 (LFS) or git blob sha1 in hex
  int64_t size = -1;         // bytes; -1 when the Hub did not say
};

std::string CleanEtag(std::string etag) {
  if (etag.rfind("W/", 0) == 0) etag.erase(0, 2);
  if (etag.size() >= 2 && etag.front() == '"' && etag.back() == '"') {
    etag = etag.substr(1, etag.size() - 2);
  }
  std::transform(etag.begin(), etag.end(), etag.begin(), ::tolower);
  return etag;
}

FileMeta HeadFile(const Hub& hub, const std::string& commit, const std::string& name) {
  FileMeta meta;
  meta.name = name;
  meta.download_url = hub.endpoint + "/" + PercentEncode(hub.repo_id, true) + "/resolve/" + commit +
                      "/" + PercentEncode(name, true);
  const std::string hub_origin = SplitUrl(hub.endpoint).origin;
  for (int redirects = 0;; ++redirects) {
    const Url url = SplitUrl(meta.download_url);
    auto r = MakeClient(url.origin)->Head(url.target, RequestHeaders(hub, true));
    if (!r) throw Error(name + ": " + DescribeError(r.error(), url.origin));
    if (r->status >= 400) ThrowHubError(*r, hub, name);
    const std::string linked_etag = r->get_header_value("X-Linked-Etag");
    const bool is_lfs = !linked_etag.empty();
    if (is_lfs || meta.etag.empty())
      meta.etag = CleanEtag(is_lfs ? linked_etag : r->get_header_value("ETag"));
    const std::string size = r->get_header_value(is_lfs ? "X-Linked-Size" : "Content-Length");
    if (!size.empty() && (is_lfs || r->status < 300))
      meta.size = std::strtoll(size.c_str(), nullptr, 10);
    if (r->status < 300) return meta;
    const std::string location = r->get_header_value("Location");
    if (location.empty())
      throw Error(name + ": HTTP " + std::to_string(r->status) + " without Location");
    if (location.front() != '/') {  // the CDN (another host), or an absolute Hub URL
      meta.download_url = location;
      meta.is_on_hub = SplitUrl(location).origin == hub_origin;
      return meta;
    }
    if (redirects == kMaxRelativeRedirects) throw Error(name + ": too many redirects");
    meta.download_url = url.origin + location;
  }
}

std::string FormatBytes(double bytes) {
  static constexpr const char* kUnits[] = {"B", "kB", "MB", "GB", "TB"};
  int unit = 0;
  while (bytes >= 1000 && unit < 4) bytes /= 1000, ++unit;
  char text[32];
  std::snprintf(text, sizeof text, unit == 0 ? "%.0f %s" : "%.1f %s", bytes, kUnits[unit]);
  return text;
}

// One file's progress on stderr: a redrawn bar on a terminal, plain lines otherwise.
class Progress {
 public:
  Progress(std::string name, int64_t total, bool is_tty)
      : name_(std::move(name)), total_(total), is_tty_(is_tty) {}

  void Start(int64_t offset) {
    bytes_ = offset;
    start_bytes_ = offset;
    start_ = Clock::now();
    if (offset > 0) Note("resuming at byte " + std::to_string(offset));
  }
  void Add(size_t num_bytes) {
    bytes_ += static_cast<int64_t>(num_bytes);
    if (is_tty_ && Clock::now() - last_draw_ > std::chrono::milliseconds(100)) Draw();
  }
  void Note(const std::string& text) const {
    std::fprintf(stderr, "%s[download] %s: %s\n", is_tty_ ? "\r\033[K" : "", name_.c_str(),
                 text.c_str());
  }
  void Finish(const std::string& checksum_note) const {
    const double seconds = std::chrono::duration<double>(Clock::now() - start_).count();
    Note(FormatBytes(static_cast<double>(bytes_)) + ", " + checksum_note + ", " +
         FormatBytes((bytes_ - start_bytes_) / std::max(seconds, 1e-3)) + "/s");
  }

 private:
  void Draw() {
    last_draw_ = Clock::now();
    const double seconds = std::chrono::duration<double>(last_draw_ - start_).count();
    const double fraction = total_ > 0 ? std::min(1.0, double(bytes_) / double(total_)) : 0.0;
    const int filled = static_cast<int>(fraction * 30);
    std::fprintf(stderr, "\r\033[K%-32.32s [%s%s] %3d%% %s / %s  %s/s", name_.c_str(),
                 std::string(filled, '#').c_str(), std::string(30 - filled, ' ').c_str(),
                 static_cast<int>(fraction * 100), FormatBytes(double(bytes_)).c_str(),
                 total_ >= 0 ? FormatBytes(double(total_)).c_str() : "?",
                 FormatBytes((bytes_ - start_bytes_) / std::max(seconds, 1e-3)).c_str());
  }

  std::string name_;
  int64_t total_, bytes_ = 0, start_bytes_ = 0;
  bool is_tty_;
  Clock::time_point start_ = Clock::now(), last_draw_{};
};

struct Attempt {
  bool is_done = false;
  bool is_retryable = false;
  std::string error;
};

// "bytes START-END/TOTAL" starts at `offset`?
bool RangeStartsAt(const std::string& content_range, int64_t offset) {
  return content_range.rfind("bytes " + std::to_string(offset) + "-", 0) == 0;
}

// One GET of meta.download_url appended to `part` from `offset` (a Range request when > 0).
Attempt FetchOnce(const Hub& hub, const FileMeta& meta, const fs::path& part, int64_t offset,
                  Progress& progress) {
  const Url url = SplitUrl(meta.download_url);
  httplib::Headers headers = RequestHeaders(hub, meta.is_on_hub);
  if (offset > 0) headers.emplace("Range", "bytes=" + std::to_string(offset) + "-");
  std::ofstream out;
  int status = 0;
  std::string error_body;
  auto on_response = [&](const httplib::Response& r) {
    status = r.status;
    const bool is_resumed =
        status == 206 && RangeStartsAt(r.get_header_value("Content-Range"), offset);
    if (status == 200 || is_resumed) {  // 200: the server ignored the Range; start over
      out.open(part, std::ios::binary | (is_resumed ? std::ios::app : std::ios::trunc));
      progress.Start(is_resumed ? offset : 0);
      return out.is_open();
    }
    return true;  // an error: its body is kept for the message
  };
  auto on_data = [&](const char* data, size_t n) {
    if (!out.is_open()) {
      if (error_body.size() < 2048) error_body.append(data, std::min<size_t>(n, 2048));
      return true;
    }
    out.write(data, static_cast<std::streamsize>(n));
    progress.Add(n);
    return static_cast<bool>(out);
  };
  auto r = MakeClient(url.origin)->Get(url.target, headers, on_response, on_data);
  const bool was_written = out.is_open();
  out.close();
  if (was_written && !out) return {false, false, "cannot write " + part.string()};
  if (!r) return {false, true, DescribeError(r.error(), url.origin)};
  if (was_written) return {true, false, ""};
  if (status == 206 || status == 416) {  // a range we did not ask for: start over
    fs::remove(part);
    return {false, true, "HTTP " + std::to_string(status) + " for a resumed download"};
  }
  if (meta.is_on_hub && (status == 401 || status == 403 || status == 404)) {
    ThrowHubError(*r, hub, meta.name);
  }
  const bool is_retryable = status >= 500 || status == 429;
  return {
      false, is_retryable,
      "HTTP " + std::to_string(status) + " from " + url.origin + ": " + error_body.substr(0, 300)};
}

// Fetches the file into `part`, resuming from what it holds; retries dropped connections.
void FetchToFile(const Hub& hub, const FileMeta& meta, const fs::path& part, Progress& progress) {
  std::string last_error;
  for (int attempt = 1; attempt <= kMaxAttempts; ++attempt) {
    if (attempt > 1) {
      progress.Note("retrying (" + last_error + ")");
      std::this_thread::sleep_for(std::chrono::milliseconds(250 << (attempt - 2)));
    }
    std::error_code ec;
    int64_t offset = fs::exists(part) ? static_cast<int64_t>(fs::file_size(part, ec)) : 0;
    if (meta.size >= 0 && offset > meta.size) fs::remove(part), offset = 0;
    if (meta.size >= 0 && offset == meta.size && offset > 0) return;  // complete already
    const Attempt a = FetchOnce(hub, meta, part, offset, progress);
    if (a.is_done) return;
    if (!a.is_retryable) throw Error(meta.name + ": " + a.error);
    last_error = a.error;
  }
  throw Error(meta.name + ": giving up after " + std::to_string(kMaxAttempts) +
              " attempts: " + last_error + " (run again to resume)");
}

bool IsHex(const std::string& s, size_t length) {
  return s.size() == length && std::all_of(s.begin(), s.end(), ::isxdigit);
}

// Hex digest of `prefix` then the file, with OpenSSL's EVP.
std::string HashFile(const fs::path& path, const EVP_MD* md, const std::string& prefix) {
  std::unique_ptr<EVP_MD_CTX, decltype(&EVP_MD_CTX_free)> ctx(EVP_MD_CTX_new(), EVP_MD_CTX_free);
  if (!ctx || EVP_DigestInit_ex(ctx.get(), md, nullptr) != 1) throw Error("OpenSSL digest init");
  EVP_DigestUpdate(ctx.get(), prefix.data(), prefix.size());
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error("cannot read " + path.string());
  std::vector<char> buffer(1 << 20);
  while (in) {
    in.read(buffer.data(), static_cast<std::streamsize>(buffer.size()));
    EVP_DigestUpdate(ctx.get(), buffer.data(), static_cast<size_t>(in.gcount()));
  }
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int length = 0;
  EVP_DigestFinal_ex(ctx.get(), digest, &length);
  std::string hex;
  for (unsigned int i = 0; i < length; ++i) {
    char byte[3];
    std::snprintf(byte, sizeof byte, "%02x", digest[i]);
    hex += byte;
  }
  return hex;
}

// LFS files: the ETag is the content's sha256; small files: git's blob sha1 (the hash of
// "blob SIZE\0" + content). Returns a note for the log; throws on a mismatch.
std::string VerifyChecksum(const fs::path& path, const FileMeta& meta) {
  const auto size = static_cast<int64_t>(fs::file_size(path));
  if (meta.size >= 0 && size != meta.size) {
    throw Error(meta.name + ": " + std::to_string(size) + " bytes, the Hub says " +
                std::to_string(meta.size));
  }
  std::string kind, got;
  if (IsHex(meta.etag, 64)) {
    kind = "sha256", got = HashFile(path, EVP_sha256(), "");
  } else if (IsHex(meta.etag, 40)) {
    kind = "git blob sha1", got = HashFile(path, EVP_sha1(), "blob " + std::to_string(size) + '\0');
  } else {
    return "not verified (the ETag '" + meta.etag + "' is no sha256 or git sha1)";
  }
  if (got != meta.etag) {
    throw Error(meta.name + ": " + kind + " mismatch: the file has " + got + ", the Hub says " +
                meta.etag + " (corrupt download: deleted; run again)");
  }
  return kind + " ok";
}

void DownloadFile(const Hub& hub, const std::string& commit, const std::string& name,
                  const fs::path& dir, bool is_tty) {
  const FileMeta meta = HeadFile(hub, commit, name);
  const fs::path target = dir / name;
  Progress progress(name, meta.size, is_tty);
  if (fs::exists(target)) {
    try {
      progress.Note("up to date (" + VerifyChecksum(target, meta) + ")");
      return;
    } catch (const Error&) {  // changed on the Hub or damaged here: fetch it again
    }
  }
  fs::create_directories(target.parent_path());
  fs::path part = target;
  part += ".incomplete";
  // A partial file left by an earlier run may hold another version's bytes: when the
  // resumed result fails its check, it is fetched once more from the start.
  for (bool is_resumed = fs::exists(part);; is_resumed = false) {
    FetchToFile(hub, meta, part, progress);
    try {
      const std::string checksum_note = VerifyChecksum(part, meta);
      fs::rename(part, target);
      progress.Finish(checksum_note);
      return;
    } catch (const Error& e) {
      fs::remove(part);
      if (!is_resumed) throw;
      progress.Note(std::string(e.what()) + "; the partial file was stale: starting over");
    }
  }
}

// Whether `llm generate --model DIR` can load the folder: a config.json our ModelConfig
// accepts, a tokenizer.model and weights. A note, not an error: a repository may hold
// another architecture, or --include may have asked for some files only.
void CheckModelFolder(const fs::path& dir) {
  std::string problems;
  auto add = [&](const std::string& p) { problems += (problems.empty() ? "" : "; ") + p; };
  if (!fs::exists(dir / "config.json")) {
    add("config.json missing");
  } else {
    try {
      const ModelConfig c = ModelConfig::Load(dir.string());
      std::fprintf(stderr, "[download] config.json: %s, %lld layers, hidden %lld, vocab %lld\n",
                   c.architecture.c_str(), (long long)c.num_layers, (long long)c.hidden_size,
                   (long long)c.vocab_size);
    } catch (const Error& e) {
      add(e.what());
    }
  }
  if (!fs::exists(dir / "tokenizer.model")) add("tokenizer.model missing");
  bool has_weights = false;
  for (const auto& entry : fs::directory_iterator(dir)) {
    has_weights |= entry.path().extension() == ".safetensors";
  }
  if (!has_weights) add("no *.safetensors");
  if (problems.empty()) {
    std::fprintf(stderr, "[download] ready: llm generate --model %s\n", dir.c_str());
  } else {
    std::fprintf(stderr, "[download] note: llm cannot load this folder as it is: %s\n",
                 problems.c_str());
  }
}

Hub HubFromEnvironment(const DownloadFlags& f) {
  Hub hub{"https://huggingface.co", "", f.repo_id, f.revision};
  if (const char* e = std::getenv("HF_ENDPOINT"); e && *e) hub.endpoint = e;
  while (hub.endpoint.size() > 1 && hub.endpoint.back() == '/') hub.endpoint.pop_back();
  if (const char* t = std::getenv("HF_TOKEN"); t && *t) hub.token = t;
  const size_t slash = f.repo_id.find('/');
  if (!IsSafeRelativePath(f.repo_id) ||
      (slash != std::string::npos && f.repo_id.find('/', slash + 1) != std::string::npos)) {
    throw Error("repository id '" + f.repo_id + "': expected owner/name (or name)");
  }
  return hub;
}

int RunDownload(const DownloadFlags& f) {
  const Hub hub = HubFromEnvironment(f);
  const RepoInfo info = FetchRepoInfo(hub);
  std::vector<std::string> names;
  for (const std::string& name : info.files) {
    if (!IsSafeRelativePath(name)) throw Error("refusing the file name '" + name + "'");
    if (IsWanted(name, f)) names.push_back(name);
  }
  if (names.empty()) {
    throw Error("no file of " + hub.repo_id + " matches --include/--exclude (" +
                std::to_string(info.files.size()) + " files in the repository)");
  }
  const fs::path dir = f.dir.empty() ? fs::path(hub.repo_id).filename() : fs::path(f.dir);
  std::fprintf(stderr, "[download] %s at %s (commit %s): %zu of %zu files -> %s\n",
               hub.repo_id.c_str(), hub.revision.c_str(), info.commit.c_str(), names.size(),
               info.files.size(), dir.c_str());
  fs::create_directories(dir);
  const bool is_tty = isatty(fileno(stderr)) != 0;
  for (const std::string& name : names) DownloadFile(hub, info.commit, name, dir, is_tty);
  CheckModelFolder(dir);
  std::printf("%s\n", dir.c_str());
  return 0;
}

}  // namespace

Command AddDownload(CLI::App& app) {
  auto* cmd = app.add_subcommand(
      "download",
      "download a model folder from the Hugging Face Hub (HF_ENDPOINT, HF_TOKEN); resumes, "
      "verifies checksums, prints the folder");
  auto f = std::make_shared<DownloadFlags>();
  cmd->add_option("repo_id", f->repo_id, "repository id, e.g. TinyLlama/TinyLlama-1.1B-Chat-v1.0")
      ->required();
  cmd->add_option("--revision", f->revision, "branch, tag or commit")->capture_default_str();
  cmd->add_option("--dir", f->dir, "destination folder (default: ./NAME)");
  // One glob per flag (repeat the flag), so that REPO_ID may follow.
  cmd->add_option("--include", f->include, "only files matching this glob (repeatable): '*.json'")
      ->allow_extra_args(false);
  cmd->add_option("--exclude", f->exclude, "skip files matching this glob (repeatable)")
      ->allow_extra_args(false);
  return [f] { return RunDownload(*f); };
}

}  // namespace llm::cli
