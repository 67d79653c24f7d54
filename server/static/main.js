// The page's entry: the status view polls, the playground streams, and a 401 asks for the key once.

import { apiKey, setApiKey } from "./api.js";
import { Chat } from "./chat.js";
import { StatusView } from "./status.js";

const $ = (id) => document.getElementById(id);
const dialog = $("key-dialog");

function askForKey() {
  if (dialog.open) return;
  $("key-input").value = apiKey();
  dialog.showModal();
  $("key-input").focus();
}

const status = new StatusView(askForKey);
const chat = new Chat(status, askForKey);

$("key-form").addEventListener("submit", (event) => {
  event.preventDefault();
  setApiKey($("key-input").value.trim());
  dialog.close();
  status.start();
});
$("key-cancel").addEventListener("click", () => dialog.close());
$("key-button").addEventListener("click", askForKey);

chat.bind();
status.start();
