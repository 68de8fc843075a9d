// The chat page (server/web/: index.html, app.js, style.css), compiled into the binary by
// server/web/embed.cmake and served by the HTTP front end: GET / is index.html, GET
// /static/NAME the other files. The page is public (no API key: it asks for one when the API
// answers 401) and loads nothing from elsewhere (its Content-Security-Policy says so).
#pragma once

#include <span>
#include <string_view>

#include "server/http/http_connection.h"

namespace llm::server {

struct WebAsset {
  std::string_view name;          // file name in server/web/, e.g. "app.js"
  std::string_view content_type;  // e.g. "text/javascript; charset=utf-8"
  std::string_view etag;          // quoted hash of the bytes, e.g. "\"3f2a...\""
  std::string_view body;
};

// Every embedded file (generated: build/web_gen/web_assets_data.cc).
std::span<const WebAsset> WebAssets();

// The file behind a URL path ("/" or "/static/NAME"), or null.
const WebAsset* FindWebAsset(std::string_view url_path);

// Answers GET url_path: the file (200, or 304 when If-None-Match has its ETag), or a 404 in
// OpenAI's error shape.
HttpResponse WebAssetResponse(const HttpRequest& req, std::string_view url_path);

}  // namespace llm::server
