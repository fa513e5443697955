// Starts Swagger UI on /docs (app/web/__init__.py), from a file rather than an inline script:
// the page's Content-Security-Policy allows this origin's scripts alone.
const root = document.getElementById('swagger-ui');
window.ui = window.SwaggerUIBundle({
  url: root.dataset.openapiUrl,
  domNode: root,
  layout: 'BaseLayout',
  deepLinking: true,
  showExtensions: true,
  showCommonExtensions: true,
  presets: [window.SwaggerUIBundle.presets.apis, window.SwaggerUIBundle.SwaggerUIStandalonePreset],
});
