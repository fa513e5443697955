// Mounts the App, configured by the page's URL: [?key=<API key>][&api=<URL>]; the API is the
// page's own origin unless `api` says.
import { createRoot } from "react-dom/client";

import { App } from "./App.jsx";

const params = new URLSearchParams(window.location.search);
createRoot(document.getElementById("root")).render(
  <App baseUrl={params.get("api") ?? window.location.origin} apiKey={params.get("key") ?? undefined} />,
);
