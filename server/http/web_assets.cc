#include "server/http/web_assets.h"

#include "server/http/http_server.h"

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

HttpResponse WebAssetResponse(const HttpRequest& req, std::string_view url_path) {
  using beast_http::field;
  const WebAsset* asset = FindWebAsset(url_path);
  if (asset == nullptr) {
    return ErrorResponse({404, "Unknown route GET " + std::string(url_path.substr(0, 200)),
                          "invalid_request_error", "", "not_found"});
  }
  HttpResponse res{beast_http::status::ok, 11};
  // The file names carry no hash, so browsers revalidate every time (a 304 costs nothing).
  res.set(field::etag, asset->etag);
  res.set(field::cache_control, "no-cache");
  res.set("X-Content-Type-Options", "nosniff");
  if (asset->name == "index.html") {
    // Nothing but this server: no CDN, no inline script, no framing.
    res.set("Content-Security-Policy",
            "default-src 'self'; img-src 'self' data:; base-uri 'none'; "
            "form-action 'none'; frame-ancestors 'none'");
    res.set("Referrer-Policy", "no-referrer");
  }
  if (std::string_view(req[field::if_none_match]).find(asset->etag) != std::string_view::npos) {
    res.result(beast_http::status::not_modified);
    return res;
  }
  res.set(field::content_type, asset->content_type);
  res.body().assign(asset->body.data(), asset->body.size());
  return res;
}

}  // namespace llm::server
