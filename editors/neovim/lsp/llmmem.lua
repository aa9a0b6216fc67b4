-- llmmem's language server for Neovim 0.11+ (`vim.lsp.config` / `vim.lsp.enable`).
--
-- Copy this file into an `lsp/` folder on your runtimepath, e.g.
--   ~/.config/nvim/lsp/llmmem.lua
-- and in init.lua:
--   vim.lsp.enable("llmmem")
-- Change any field without editing the file:
--   vim.lsp.config("llmmem", { settings = { llmmem = { gpu = "H100" } } })
--
-- `llmmem-lsp` comes with `pip install llmmem`; when it is not on PATH, use the Python that has
-- llmmem: cmd = { "/path/to/venv/bin/python", "-m", "llmmem_lsp" }.

if vim.fn.has("nvim-0.11") ~= 1 then
  vim.notify(
    "llmmem: lsp/llmmem.lua is for Neovim 0.11+ (vim.lsp.config); on Neovim 0.10 use llmmem-0.10.lua",
    vim.log.levels.WARN
  )
end

-- The server's settings (the same keys as VS Code's `llmmem.*`); the server reads them from
-- init_options at start and from `settings.llmmem` when it asks for its configuration.
local llmmem = {
  -- gpu = "A100-80GB",   -- GPU for files that name none; unset: a pragma, pyproject.toml, this machine's
  -- worldSize = 8,       -- GPUs per job where no launcher or config says
  hub = true, -- look unknown models up on the Hugging Face Hub (in the background)
  hubTimeoutSeconds = 3,
  -- severity = { LLM002 = "info", LLM005 = "off" },  -- per rule: error, warning, info or off
  debounceMs = 300, -- quiet time after an edit before analysing
  detectGpu = true, -- with no GPU set anywhere, use this machine's
}

return {
  cmd = { "llmmem-lsp" },
  filetypes = { "python", "yaml", "json", "sh" },
  root_markers = { "pyproject.toml", "setup.py", "setup.cfg", ".git" },
  init_options = llmmem,
  settings = { llmmem = llmmem },
}
