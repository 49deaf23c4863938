// Swagger UI over the ops API (no inline script: the console's CSP allows only its own files)
window.addEventListener("load", function () {
  var node = document.getElementById("swagger-ui");
  window.ui = SwaggerUIBundle({ url: node.dataset.url, dom_id: "#swagger-ui", deepLinking: true });
});
