#include "server/http/web_assets.h"

#include <httplib.h>

namespace llm::server {

const WebAsset* FindWebAsset(std::string_view url_path) {
  constexpr std::string_view kStatic = "/static/";
  std::string_view name;
  if (url_path == "/") {
    name = "index.html";
  } else if (url_path.starts_with(kStatic)) {
    name = url_path.substr(kStatic.size());
  } else {
    return nullptr;
  }
  for (const WebAsset& asset : WebAssets()) {
    if (asset.name == name) return &asset;
  }
  return nullptr;
}

void ServeWebAsset(const httplib::Request& req, httplib::Response& res) {
  const WebAsset* asset = FindWebAsset(req.path);
  if (asset == nullptr) {
    res.status = 404;
    return;
  }
  const std::string etag(asset->etag);
  // The file names carry no hash, so browsers revalidate every time (a 304 costs nothing).
  res.set_header("ETag", etag);
  res.set_header("Cache-Control", "no-cache");
  res.set_header("X-Content-Type-Options", "nosniff");
  if (asset->name == "index.html") {
    // Nothing but this server: no CDN, no inline script, no framing.
    res.set_header("Content-Security-Policy",
                   "default-src 'self'; img-src 'self' data:; base-uri 'none'; "
                   "form-action 'none'; frame-ancestors 'none'");
    res.set_header("Referrer-Policy", "no-referrer");
  }
  if (req.get_header_value("If-None-Match").find(etag) != std::string::npos) {
    res.status = 304;
    return;
  }
  res.set_content(asset->body.data(), asset->body.size(), std::string(asset->content_type));
}

}  // namespace llm::server
