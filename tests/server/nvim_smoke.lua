-- Headless Neovim as an llmmem client: open a script, wait for diagnostics, hover, write JSON.
-- Uses only what Neovim 0.7 has (vim.lsp.start_client, buf_request_sync).
--   LLMMEM_PYTHON=python LLMMEM_FILE=train.py LLMMEM_OUT=out.json \
--     nvim --headless --clean -c "luafile nvim_smoke.lua"
local python = os.getenv("LLMMEM_PYTHON")
local file = os.getenv("LLMMEM_FILE")
local out = os.getenv("LLMMEM_OUT")
local result = { diagnostics = {}, hover = vim.NIL, error = vim.NIL }

local function finish()
  vim.fn.writefile({ vim.fn.json_encode(result) }, out)
  vim.cmd("qall!")
end

local ok, err = pcall(function()
  vim.cmd("edit " .. vim.fn.fnameescape(file))
  local bufnr = vim.api.nvim_get_current_buf()
  local client_id = vim.lsp.start_client({
    name = "llmmem",
    cmd = { python, "-m", "llmmem_lsp" },
    root_dir = vim.fn.fnamemodify(file, ":h"),
    init_options = { gpu = "RTX-4090", detectGpu = false, hub = false },
  })
  assert(client_id, "the server did not start")
  vim.lsp.buf_attach_client(bufnr, client_id)
  vim.wait(60000, function()
    return #vim.diagnostic.get(bufnr) > 0
  end, 100)
  for _, d in ipairs(vim.diagnostic.get(bufnr)) do
    table.insert(result.diagnostics, { code = d.code, message = d.message, lnum = d.lnum, source = d.source })
  end
  local lines = vim.api.nvim_buf_get_lines(bufnr, 0, -1, false)
  local line_nr, col = 0, 0
  for i, text in ipairs(lines) do
    local at = text:find("per_device_train_batch_size", 1, true)
    if at then
      line_nr, col = i - 1, at + 2
      break
    end
  end
  local params = {
    textDocument = { uri = vim.uri_from_bufnr(bufnr) },
    position = { line = line_nr, character = col },
  }
  local answers = vim.lsp.buf_request_sync(bufnr, "textDocument/hover", params, 30000)
  for _, answer in pairs(answers or {}) do
    if answer.result and answer.result.contents then
      result.hover = answer.result.contents.value
    end
  end
  vim.lsp.stop_client(client_id)
end)
if not ok then
  result.error = tostring(err)
end
finish()
