// The chat page (server/web/, compiled in): served at / and /static/NAME with the right
// Content-Type, revalidated by ETag, public when the API needs a key, 404 for unknown files,
// and referring to nothing but its own embedded files.
#include "server/http/web_assets.h"

#include <gtest/gtest.h>
#include <httplib.h>

#include <regex>
#include <thread>

#include "server/http/http_server.h"
#include "tests/test_util.h"

namespace llm::server {
namespace {

using nlohmann::json;

class WebAssetsTest : public ::testing::Test {
 protected:
  void Start(ServerConfig config = {}) {
    engine_ = std::make_unique<Engine>(test::StoriesModel(), test::StoriesTokenizer(),
                                       EngineConfig{.num_kv_blocks = 16});
    config.port = 0;
    const ModelConfig& model = test::StoriesModel().config();
    front_end_ = std::make_unique<FrontEnd>(*engine_, "stories260K");
    server_ = std::make_unique<HttpServer>(
        *engine_, *front_end_, test::StoriesTokenizer(),
        ModelInfo{"stories260K", model.max_position_embeddings, model.vocab_size}, config);
    port_ = server_->Bind();
    engine_->Start();
    thread_ = std::thread([this] { server_->Serve(); });
  }
  void TearDown() override {
    if (server_) server_->Stop();
    if (thread_.joinable()) thread_.join();
    if (engine_) engine_->Stop();
  }
  httplib::Client Client() { return httplib::Client("127.0.0.1", port_); }

  std::unique_ptr<Engine> engine_;
  std::unique_ptr<FrontEnd> front_end_;
  std::unique_ptr<HttpServer> server_;
  std::thread thread_;
  int port_ = 0;
};

TEST_F(WebAssetsTest, RootIsTheChatPage) {
  Start();
  auto c = Client();
  auto r = c.Get("/");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200);
  EXPECT_EQ(r->get_header_value("Content-Type"), "text/html; charset=utf-8");
  EXPECT_NE(r->body.find("<!doctype html>"), std::string::npos);
  EXPECT_NE(r->body.find("/static/app.js"), std::string::npos);
  EXPECT_EQ(r->get_header_value("Cache-Control"), "no-cache");
  EXPECT_NE(r->get_header_value("Content-Security-Policy").find("default-src 'self'"),
            std::string::npos);
  EXPECT_EQ(r->body, std::string(FindWebAsset("/")->body));
}

TEST_F(WebAssetsTest, StaticFilesHaveTheirContentTypes) {
  Start();
  auto c = Client();
  for (const auto& [path, type] : {std::pair{"/static/app.js", "text/javascript; charset=utf-8"},
                                   std::pair{"/static/style.css", "text/css; charset=utf-8"}}) {
    auto r = c.Get(path);
    ASSERT_TRUE(r) << path;
    EXPECT_EQ(r->status, 200) << path;
    EXPECT_EQ(r->get_header_value("Content-Type"), type) << path;
    EXPECT_EQ(r->get_header_value("X-Content-Type-Options"), "nosniff") << path;
    EXPECT_FALSE(r->body.empty()) << path;
  }
}

TEST_F(WebAssetsTest, UnknownStaticPathIs404AndPostIs405) {
  Start();
  auto c = Client();
  for (const char* path : {"/static/nope.js", "/static/", "/static/../index.html",
                           "/static/index.html/", "/index.htm"}) {
    auto r = c.Get(path);
    ASSERT_TRUE(r) << path;
    EXPECT_EQ(r->status, 404) << path;
    EXPECT_EQ(json::parse(r->body)["error"]["code"], "not_found") << path;
  }
  auto post = c.Post("/", "{}", "application/json");
  ASSERT_TRUE(post);
  EXPECT_EQ(post->status, 405);
  EXPECT_EQ(post->get_header_value("Allow"), "GET");
}

TEST_F(WebAssetsTest, EtagRevalidatesWith304) {
  Start();
  auto c = Client();
  auto first = c.Get("/static/app.js");
  ASSERT_TRUE(first);
  const std::string etag = first->get_header_value("ETag");
  ASSERT_FALSE(etag.empty());
  auto again = c.Get("/static/app.js", {{"If-None-Match", etag}});
  ASSERT_TRUE(again);
  EXPECT_EQ(again->status, 304);
  EXPECT_TRUE(again->body.empty());
  auto other = c.Get("/static/app.js", {{"If-None-Match", "\"stale\""}});
  ASSERT_TRUE(other);
  EXPECT_EQ(other->status, 200);
}

TEST_F(WebAssetsTest, PageIsPublicWhenTheApiNeedsAKey) {
  Start({.api_key = "sekret"});
  auto c = Client();
  EXPECT_EQ(c.Get("/")->status, 200);
  EXPECT_EQ(c.Get("/static/app.js")->status, 200);
  EXPECT_EQ(c.Get("/v1/models")->status, 401);
}

// Every src/href of the page is one of its own embedded files (or the empty data: icon):
// nothing loads from a CDN.
TEST(WebAssets, PageRefersOnlyToEmbeddedFiles) {
  const std::string html(FindWebAsset("/")->body);
  const std::regex ref(R"re((?:src|href)="([^"]*)")re");
  int num_refs = 0;
  for (auto it = std::sregex_iterator(html.begin(), html.end(), ref); it != std::sregex_iterator();
       ++it) {
    const std::string url = (*it)[1];
    ++num_refs;
    if (url == "data:,") continue;
    EXPECT_NE(FindWebAsset(url), nullptr) << url;
  }
  EXPECT_GE(num_refs, 3);
  for (const WebAsset& asset : WebAssets()) EXPECT_FALSE(asset.body.empty()) << asset.name;
}

}  // namespace
}  // namespace llm::server
