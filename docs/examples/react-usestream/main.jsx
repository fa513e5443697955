// Mounts the App, configured by the page's URL: ?assistant=<id>[&key=<API key>][&api=<URL>]
// [&thread=<id>]; the API is the page's own origin's /agent-protocol unless `api` says.
import { createRoot } from "react-dom/client";

import { App } from "./App.jsx";

const params = new URLSearchParams(window.location.search);
createRoot(document.getElementById("root")).render(
  <App
    apiUrl={params.get("api") ?? `${window.location.origin}/agent-protocol`}
    apiKey={params.get("key") ?? undefined}
    assistantId={params.get("assistant")}
    threadId={params.get("thread")}
  />,
);
