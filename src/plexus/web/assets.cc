#include "plexus/web/assets.h"

#include <cstddef>

namespace plexus::web {

extern const char kIndexHtml[];
extern const size_t kIndexHtml_size;
extern const char kAppJs[];
extern const size_t kAppJs_size;
extern const char kStyleCss[];
extern const size_t kStyleCss_size;
extern const char kChartJs[];
extern const size_t kChartJs_size;

const Asset* FindAsset(absl::string_view path) {
  static const Asset kIndex{"text/html; charset=utf-8",
                            {kIndexHtml, kIndexHtml_size}};
  static const Asset kApp{"text/javascript; charset=utf-8",
                          {kAppJs, kAppJs_size}};
  static const Asset kStyle{"text/css; charset=utf-8",
                            {kStyleCss, kStyleCss_size}};
  static const Asset kChart{"text/javascript; charset=utf-8",
                            {kChartJs, kChartJs_size}};
  if (path == "/" || path == "/index.html") return &kIndex;
  if (path == "/app.js") return &kApp;
  if (path == "/style.css") return &kStyle;
  if (path == "/chart.js") return &kChart;
  return nullptr;
}

}  // namespace plexus::web
